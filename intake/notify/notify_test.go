package notify_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// hit is one request the receiver got.
type hit struct {
	id, event, sig string
	body           []byte
	ok             bool // answered 2xx
}

// receiver is a webhook endpoint that answers 503 while failing is set.
type receiver struct {
	*httptest.Server
	failing atomic.Bool
	mu      sync.Mutex
	hits    []hit
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		h := hit{id: req.Header.Get("Intake-Event-Id"), event: req.Header.Get("Intake-Event"), sig: req.Header.Get("Intake-Signature"), body: b, ok: !r.failing.Load()}
		r.mu.Lock()
		r.hits = append(r.hits, h)
		r.mu.Unlock()
		if !h.ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) got() []hit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.hits)
}

// verify is what docs/design.md "Notifications" tells a receiver to do:
// split t and the v1 signatures, recompute HMAC-SHA256(secret, t + "." +
// body), compare it with each v1 in constant time (one matches: the
// request is signed with the secret), and refuse a timestamp far from now.
func verify(secret, header string, body []byte, now time.Time) bool {
	var ts string
	var v1s []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			v1s = append(v1s, v)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return false
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "." + string(body)))
	sum := m.Sum(nil)
	ok := false
	for _, v1 := range v1s {
		want, _ := hex.DecodeString(v1)
		ok = hmac.Equal(sum, want) || ok
	}
	return ok
}

func event(t *testing.T, pool *pgxpool.Pool, partner, ev string, payload map[string]any) int64 {
	t.Helper()
	b, _ := json.Marshal(payload)
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO intake_outbox (partner_id, event, payload) VALUES ($1, $2, $3) RETURNING event_id`,
		partner, ev, string(b)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, limit, cond, testenv.Says(what))
}

func fast() notify.Config {
	c := notify.Config{Timeout: 2 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Poll: 50 * time.Millisecond}
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return c
}

// Two replicas deliver the outbox to a receiver that fails for a while:
// every event reaches every subscribed endpoint (global and per partner,
// by event), signed over its exact body, once answered 2xx; events nobody
// subscribes to go nowhere; failures and deliveries are counted.
func TestTwoReplicasDeliverEveryEventSignedThroughAnOutage(t *testing.T) {
	_, pool := testenv.DB(t)
	t.Setenv("HOOK_SECRET_G", "global-secret")
	t.Setenv("HOOK_SECRET_P", "partner-secret")
	g, p := newReceiver(t), newReceiver(t)
	g.failing.Store(true)
	p.failing.Store(true)
	global := []partners.Notify{{URL: g.URL + "/hook", SecretEnv: "HOOK_SECRET_G", Events: []string{"quarantined", "failed"}}}
	parts := []partners.Config{{ID: "acme", Notify: []partners.Notify{{URL: p.URL + "/acme", SecretEnv: "HOOK_SECRET_P", Events: []string{"late", "awaiting_approval"}}}}, {ID: "globex"}}
	var wantG, wantP []int64
	for i := 0; i < 12; i++ {
		wantG = append(wantG, event(t, pool, []string{"acme", "globex"}[i%2], []string{"quarantined", "failed"}[i%2], map[string]any{"intake_id": i, "reason": "header_mismatch"}))
	}
	wantP = append(wantP, event(t, pool, "acme", "late", map[string]any{"feed": "orders"}))
	wantP = append(wantP, event(t, pool, "acme", "awaiting_approval", map[string]any{"intake_id": 99, "state": "awaiting_approval", "plan_hash": "3f9a"}))
	event(t, pool, "globex", "late", map[string]any{"feed": "orders"})          // nobody subscribes
	event(t, pool, "acme", "rejected_rows", map[string]any{"rows_rejected": 1}) // nobody subscribes
	var regs []*prometheus.Registry
	for _, w := range []string{"a", "b"} {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		s := notify.New(pool, w, fast(), global, parts, reg, testenv.Logger(t))
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
	}
	waitFor(t, time.Minute, "failed attempts", func() bool { return len(g.got()) >= 24 && len(p.got()) >= 2 })
	g.failing.Store(false)
	p.failing.Store(false)
	waitFor(t, time.Minute, "every delivery", func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE state = 'delivered'`) == int64(len(wantG)+len(wantP))
	})
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery`); n != int64(len(wantG)+len(wantP)) {
		t.Fatalf("%d deliveries, want %d (unsubscribed events go nowhere)", n, len(wantG)+len(wantP))
	}
	check := func(r *receiver, secret string, want []int64) {
		t.Helper()
		okBy := map[string]int{}
		bodies := map[string]string{}
		for _, h := range r.got() {
			if !verify(secret, h.sig, h.body, time.Now()) {
				t.Fatalf("event %s: signature %q does not verify over its body", h.id, h.sig)
			}
			if b, seen := bodies[h.id]; seen && b != string(h.body) {
				t.Fatalf("event %s: the body changed between attempts:\n%s\n%s", h.id, b, h.body)
			}
			bodies[h.id] = string(h.body)
			var doc struct {
				ID    int64  `json:"id"`
				Event string `json:"event"`
			}
			if err := json.Unmarshal(h.body, &doc); err != nil || strconv.FormatInt(doc.ID, 10) != h.id || doc.Event != h.event {
				t.Fatalf("body %s does not match its headers (id %s, event %s)", h.body, h.id, h.event)
			}
			if h.ok {
				okBy[h.id]++
			}
		}
		for _, id := range want {
			if okBy[strconv.FormatInt(id, 10)] != 1 {
				t.Fatalf("event %d acknowledged %d times, want once: %v", id, okBy[strconv.FormatInt(id, 10)], okBy)
			}
		}
		if len(okBy) != len(want) {
			t.Fatalf("receiver acknowledged %d events, want %d", len(okBy), len(want))
		}
	}
	check(g, "global-secret", wantG)
	check(p, "partner-secret", wantP)
	// a delivery is counted right after its row says delivered
	var delivered, failed float64
	count := func() {
		delivered, failed = 0, 0
		for _, reg := range regs {
			delivered += sumCounter(t, reg, "intake_notify_deliveries_total", "delivered")
			failed += sumCounter(t, reg, "intake_notify_deliveries_total", "failed")
		}
	}
	waitFor(t, time.Minute, "every delivery counted", func() bool {
		count()
		return delivered >= float64(len(wantG)+len(wantP))
	})
	if delivered != float64(len(wantG)+len(wantP)) || failed < 26 {
		t.Fatalf("metrics: delivered %v, failed %v", delivered, failed)
	}
}

func sumCounter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// A receiver that never answers 2xx: the delivery is retried with backoff
// until its budget is spent, then marked dead, counted and shown in
// intake_notify_dead, never dropped silently; an unset secret sends
// nothing unsigned.
func TestADeliveryPastItsBudgetIsDeadNotDropped(t *testing.T) {
	_, pool := testenv.DB(t)
	t.Setenv("HOOK_SECRET", "s")
	r := newReceiver(t)
	r.failing.Store(true)
	cfg := fast()
	cfg.Budget, cfg.Keep = 500*time.Millisecond, time.Hour
	parts := []partners.Config{{ID: "acme", Notify: []partners.Notify{
		{URL: r.URL, SecretEnv: "HOOK_SECRET", Events: []string{"failed"}},
		{ID: "unsigned", URL: r.URL + "/unsigned", SecretEnv: "HOOK_SECRET_UNSET", Events: []string{"failed"}},
	}}}
	if m := notify.MissingSecrets(nil, parts); !slices.Equal(m, []string{"HOOK_SECRET_UNSET"}) {
		t.Fatalf("MissingSecrets: %v", m)
	}
	id := event(t, pool, "acme", "failed", map[string]any{"intake_id": 7})
	reg := prometheus.NewRegistry()
	s := notify.New(pool, "a", cfg, nil, parts, reg, testenv.Logger(t))
	waitFor(t, time.Minute, "dead", func() bool {
		s.RunOnce(context.Background())
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND state = 'dead'`, id) == 2
	})
	if got := gaugeValue(t, reg, "intake_notify_dead"); got != 2 {
		t.Fatalf("intake_notify_dead %v, want 2", got)
	}
	if sumCounter(t, reg, "intake_notify_deliveries_total", "dead") != 2 {
		t.Fatal("dead deliveries not counted")
	}
	for _, h := range r.got() {
		if h.sig == "" || !verify("s", h.sig, h.body, time.Now()) {
			t.Fatalf("a request went out unsigned: %+v", h)
		}
	}
	var lastErr string
	if err := pool.QueryRow(context.Background(), `SELECT last_error FROM intake_outbox_delivery WHERE event_id = $1 AND endpoint_id = 'unsigned'`, id).Scan(&lastErr); err != nil || !strings.Contains(lastErr, "HOOK_SECRET_UNSET is not set") {
		t.Fatalf("the unsigned endpoint's error: %q %v", lastErr, err)
	}
	if testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox WHERE event_id = $1`, id) != 1 {
		t.Fatal("the dead event left the outbox")
	}

	// Once the endpoint is fixed, ops send the dead delivery again (intake
	// notify redeliver): it gets a fresh budget, is delivered under the
	// same event id and the decision is audited; the other endpoint's
	// delivery, not chosen, stays dead, and a second redelivery finds
	// nothing dead to revive.
	l := ledger.New(pool, time.Minute)
	ctx := context.Background()
	dead, err := l.DeadDeliveries(ctx, []string{"acme"}, 10)
	if err != nil || len(dead) != 2 || dead[0].EventID != id || dead[0].Attempts == 0 {
		t.Fatalf("dead deliveries %+v %v", dead, err)
	}
	if n, err := l.DeadDeliveries(ctx, []string{"other"}, 10); err != nil || len(n) != 0 {
		t.Fatalf("another partner's scope lists %d dead deliveries (%v)", len(n), err)
	}
	r.failing.Store(false)
	// a dead delivery is listed by its endpoint's id (the URL without an
	// id of its own has the id derived from its URL), and sent again by it
	signed := partners.DerivedNotifyID(r.URL)
	var ids []string
	for _, d := range dead {
		ids = append(ids, d.EndpointID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"unsigned", signed}) {
		t.Fatalf("dead deliveries list endpoints %v, want unsigned and %s", ids, signed)
	}
	pick := ledger.Redelivery{Partners: []string{"acme"}, EventID: id, Endpoints: []string{signed}, Actor: "ops", Reason: "endpoint fixed"}
	if n, err := l.Redeliver(ctx, pick); err != nil || n != 1 {
		t.Fatalf("redelivered %d (%v), want 1", n, err)
	}
	waitFor(t, time.Minute, "redelivered", func() bool {
		s.RunOnce(ctx)
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND endpoint_id = $2 AND state = 'delivered'`, id, signed) == 1
	})
	if testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND endpoint_id = 'unsigned' AND state = 'dead'`, id) != 1 {
		t.Fatal("a delivery nobody chose was sent again")
	}
	last := r.got()[len(r.got())-1]
	if !last.ok || last.id != strconv.FormatInt(id, 10) {
		t.Fatalf("the redelivery reached the receiver as %+v, want event %d answered 2xx", last, id)
	}
	if testenv.Count(t, pool, `SELECT count(*) FROM intake_audit WHERE action = 'notify_redeliver' AND actor = 'ops' AND partner_id = 'acme' AND detail LIKE $1`,
		"event "+strconv.FormatInt(id, 10)+" %") != 1 {
		t.Fatal("the redelivery is not audited")
	}
	if n, err := l.Redeliver(ctx, pick); err != nil || n != 0 {
		t.Fatalf("a delivered delivery was revived again: %d %v", n, err)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The events the config accepts are the ones the ledger writes
// (awaiting_approval by RecordPlan: intake/approval_test.go).
func TestConfigEventsAreTheLedgersEvents(t *testing.T) {
	want := []string{ledger.EventQuarantined, ledger.EventFailed, ledger.EventRejectedRows, ledger.EventLate,
		ledger.EventHostKeyMismatch, ledger.EventAwaitingApproval}
	if !slices.Equal(partners.NotifyEvents, want) {
		t.Fatalf("partners.NotifyEvents %v, ledger %v", partners.NotifyEvents, want)
	}
	for _, bad := range [][]partners.Notify{
		{{URL: "ftp://x", SecretEnv: "S", Events: []string{"late"}}},
		{{URL: "https://u:p@x/", SecretEnv: "S", Events: []string{"late"}}},
		{{URL: "https://x/", SecretEnv: "", Events: []string{"late"}}},
		{{URL: "https://x/", SecretEnv: "S", Events: nil}},
		{{URL: "https://x/", SecretEnv: "S", Events: []string{"lat"}}},
		{{URL: "https://x/", SecretEnv: "S", Events: []string{"late", "late"}}},
		{{URL: "https://x/", SecretEnv: "S", Events: []string{"late"}}, {URL: "https://x/", SecretEnv: "T", Events: []string{"failed"}}},
		{{URL: "http://x.example/", SecretEnv: "S", Events: []string{"late"}}},
		{{URL: "http://192.168.1.1/", SecretEnv: "S", Events: []string{"late"}}},
		{{ID: "a", URL: "https://x/", SecretEnv: "S", Events: []string{"late"}}, {ID: "a", URL: "https://y/", SecretEnv: "S", Events: []string{"late"}}},
		{{ID: "url-1234", URL: "https://x/", SecretEnv: "S", Events: []string{"late"}}},
		{{ID: "Bad Id", URL: "https://x/", SecretEnv: "S", Events: []string{"late"}}},
		{{URL: "https://x/", SecretEnv: "S", SecretEnvs: []string{"S"}, Events: []string{"late"}}},
		{{URL: "https://x/", SecretEnv: "S", SecretEnvs: []string{"https://leak"}, Events: []string{"late"}}},
	} {
		if err := partners.ValidateNotify("notify", bad); err == nil {
			t.Fatalf("%+v validated", bad)
		}
	}
	if err := partners.ValidateNotify("notify", []partners.Notify{{URL: "https://hooks.example/intake", SecretEnv: "S", Events: []string{"awaiting_approval"}},
		{ID: "local", URL: "http://127.0.0.1:9000/hook", SecretEnv: "S", SecretEnvs: []string{"S_NEXT"}, Events: []string{"late"}}}); err != nil {
		t.Fatal(err)
	}
}
