package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

type hookHit struct {
	id, sig string
	body    []byte
	ok      bool
}

// verifyHook is the receiver's check as docs/design.md "Notifications"
// describes it: HMAC-SHA256(secret, t + "." + body) against v1, constant
// time, t within 5 minutes of now.
func verifyHook(secret, header string, body []byte) bool {
	var ts, v1 string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		if k == "t" {
			ts = v
		} else if k == "v1" {
			v1 = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + string(body)))
	want, err := hex.DecodeString(v1)
	return err == nil && hmac.Equal(m.Sum(nil), want)
}

// On the real binary: a webhook receiver that answers 503
// for a while. Three files end failed (header mismatch), quarantined (too
// many rejected rows) and archived with a rejected row. When the receiver
// recovers, the daemon is SIGKILLed with a delivery in flight (taken in by
// the receiver, its answer never heard) and started again: that delivery
// is sent again once its lease runs out (at least once), and the receiver
// has every event of the outbox acknowledged, each request signed over
// exactly the body the outbox holds, carrying ids, codes and counts and
// no cell value.
func TestWebhookReceivesEveryEventSignedAcrossAnOutageAndASigkill(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "hooks")
	const secret = "hook-secret-for-the-test"
	t.Setenv("INTAKE_TEST_HOOK_SECRET", secret)
	var failing, hold atomic.Bool
	failing.Store(true)
	held, release := make(chan string, 1), make(chan struct{})
	var mu sync.Mutex
	var hits []hookHit
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := hookHit{id: r.Header.Get("Intake-Event-Id"), sig: r.Header.Get("Intake-Signature"), body: b, ok: !failing.Load()}
		mu.Lock()
		hits = append(hits, h)
		mu.Unlock()
		if hold.CompareAndSwap(true, false) {
			// taken in, but the answer is held until the daemon is dead
			held <- h.id
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		if !h.ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	got := func() []hookHit { mu.Lock(); defer mu.Unlock(); return slices.Clone(hits) }

	cfg := writeConfigOpts(t, site, cfgOpts{worker: "hooks-1", poll: "@every 1s", schedule: "@every 1h"})
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hook := fmt.Sprintf(`notify:
  - url: %s/intake
    secret_env: INTAKE_TEST_HOOK_SECRET
    events: [quarantined, failed, rejected_rows, late, host_key_mismatch, awaiting_approval]
notify_delivery:
  timeout: 2s
  min_backoff: 100ms
  max_backoff: 400ms
  poll: 100ms
`, srv.URL)
	if err := os.WriteFile(cfg, []byte(hook+string(raw)), 0o600); err != nil {
		t.Fatal(err)
	}

	const marker = "CELLVALUE" // in the rejected cells: must not travel
	site.Drop(t, "orders-failed.csv", "wrong,header\n1,2\n")
	bad := fmt.Sprintf("B-1,%s@x,1.00,%s,2026-11-01T10:00:00Z,1\n", marker, marker)
	site.Drop(t, "orders-held.csv", testenv.OrdersCSV("H", 2)+strings.Repeat(bad, 3))
	site.Drop(t, "orders-rejects.csv", testenv.OrdersCSV("R", 20)+strings.Replace(bad, "B-1", "R-99", 1))

	p := startIntake(t, url, "", "run", "--config", cfg)
	waitFor(t, 2*time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox`) == 3 && len(got()) >= 6
	}, p)
	// The receiver recovers; the daemon dies with a delivery in flight
	// (the receiver took it in, the daemon never heard the answer).
	hold.Store(true)
	failing.Store(false)
	var inFlight string
	select {
	case inFlight = <-held:
	case <-time.After(time.Minute):
		t.Fatalf("no delivery reached the receiver:\n%s", tail(p.output()))
	}
	p.signal(syscall.SIGKILL)
	p.wait(t, time.Minute)
	close(release)
	p = startIntake(t, url, "", "run", "--config", cfg)
	waitFor(t, 2*time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE state = 'delivered'`) == 3
	}, p)

	// the delivery in flight at the kill was sent again once its lease ran out
	resent := 0
	for _, h := range got() {
		if h.id == inFlight {
			resent++
		}
	}
	if resent < 2 {
		t.Fatalf("event %s was in flight at the SIGKILL and reached the receiver %d time(s), want it sent again", inFlight, resent)
	}
	kinds := map[string]string{}
	for _, f := range testenv.Files(t, pool, site.Config.ID) {
		switch {
		case f.State == "failed_terminal":
			kinds[ledger.EventFailed] = strconv.FormatInt(f.ID, 10)
		case f.State == "quarantined":
			kinds[ledger.EventQuarantined] = strconv.FormatInt(f.ID, 10)
		case f.State == "archived" && f.Rejected == 1:
			kinds[ledger.EventRejectedRows] = strconv.FormatInt(f.ID, 10)
		}
	}
	if len(kinds) != 3 {
		t.Fatalf("files did not end failed, quarantined and archived with a rejected row: %+v", testenv.Files(t, pool, site.Config.ID))
	}
	rs, err := pool.Query(context.Background(), `SELECT event_id, partner_id, event, payload::text, created_at FROM intake_outbox ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	var events []ledger.Delivery
	for rs.Next() {
		var d ledger.Delivery
		var payload string
		if err := rs.Scan(&d.EventID, &d.Partner, &d.Event, &payload, &d.CreatedAt); err != nil {
			t.Fatal(err)
		}
		d.Payload = []byte(payload)
		d.EndpointID = partners.DerivedNotifyID(srv.URL + "/intake") // the hook has no id: its URL's
		events = append(events, d)
	}
	rs.Close()
	all := got()
	for _, h := range all {
		if !verifyHook(secret, h.sig, h.body) {
			t.Fatalf("event %s: signature %q does not verify", h.id, h.sig)
		}
		if strings.Contains(string(h.body), marker) {
			t.Fatalf("a cell value travelled: %s", h.body)
		}
	}
	for _, ev := range events {
		want := notify.Body(ev, "")
		acked := 0
		for _, h := range all {
			if h.id != strconv.FormatInt(ev.EventID, 10) {
				continue
			}
			if string(h.body) != string(want) {
				t.Fatalf("event %d: sent\n%s\nwant (from the outbox)\n%s", ev.EventID, h.body, want)
			}
			if h.ok {
				acked++
			}
		}
		if acked < 1 {
			t.Fatalf("event %d (%s) never acknowledged", ev.EventID, ev.Event)
		}
		id, ok := kinds[ev.Event]
		if !ok || !strings.Contains(string(want), `"intake_id": `+id) && !strings.Contains(string(want), `"intake_id":`+id) {
			t.Fatalf("event %d (%s) does not carry the intake id %s: %s", ev.EventID, ev.Event, id, want)
		}
		delete(kinds, ev.Event)
	}
	if len(kinds) != 0 {
		t.Fatalf("no event for %v", kinds)
	}
	p.signal(syscall.SIGTERM)
	p.wait(t, time.Minute)
}

// A webhook whose secret_env is unset: `intake run` refuses to start
// (exit 2, naming the variable) rather than send unsigned requests.
func TestRunRefusesAWebhookWithoutItsSecret(t *testing.T) {
	site := testenv.NewSite(t, "nosecret")
	t.Setenv("INTAKE_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hook := "notify:\n  - {url: \"https://hooks.example/intake\", secret_env: INTAKE_TEST_SECRET_NEVER_SET, events: [failed]}\n"
	if err := os.WriteFile(cfg, []byte(hook+string(raw)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runCLI("run", "--config", cfg, "--log-format", "text")
	if code != 2 || !strings.Contains(out, "INTAKE_TEST_SECRET_NEVER_SET") {
		t.Fatalf("intake run exited %d:\n%s", code, out)
	}
}
