package notify_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A delivery row written straight into the database cannot choose where
// a replica posts or what it signs with: the row has no URL or secret
// column, and a row naming an endpoint id the config does not know
// (among the global webhooks and the event's partner's: another
// partner's webhook does not count) is marked dead unsent, with its
// reason, counted as refused and listed by notify dead. No request
// reaches any receiver for it, while a normal event in the same passes
// reaches its configured receiver.
func TestAForgedDeliveryRowIsNotSent(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	t.Setenv("HOOK_SECRET_A", "acme-secret")
	t.Setenv("HOOK_SECRET_B", "globex-secret")
	t.Setenv("INTAKE_PGP_PASSPHRASE", "pgp-passphrase")
	a, b := newReceiver(t), newReceiver(t)
	parts := []partners.Config{
		{ID: "acme", Notify: []partners.Notify{{ID: "acme-ops", URL: a.URL + "/acme", SecretEnv: "HOOK_SECRET_A", Events: []string{"failed"}}}},
		{ID: "globex", Notify: []partners.Notify{{ID: "globex-ops", URL: b.URL + "/globex", SecretEnv: "HOOK_SECRET_B", Events: []string{"late"}}}},
	}
	reg := prometheus.NewRegistry()
	s := notify.New(pool, "a", fast(), nil, parts, reg, testenv.Logger(t))

	// the attack as rows used to allow it: a URL and a secret's variable
	// of the attacker's choosing cannot even be written
	forged := event(t, pool, "acme", "quarantined", map[string]any{"intake_id": 1})
	if _, err := pool.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, endpoint_id, url, secret_env) VALUES ($1, 'acme-ops', $2, 'INTAKE_PGP_PASSPHRASE')`,
		forged, a.URL+"/steal"); err == nil || !strings.Contains(err.Error(), "column") {
		t.Fatalf("a delivery row took a URL and a secret_env: %v", err)
	}
	s.RunOnce(ctx) // fans the quarantined event out: nobody subscribes to it
	// an id nobody configured, and globex's webhook for an acme event
	for _, id := range []string{"evil", "globex-ops"} {
		if _, err := pool.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, endpoint_id) VALUES ($1, $2)`, forged, id); err != nil {
			t.Fatal(err)
		}
	}
	normal := event(t, pool, "acme", "failed", map[string]any{"intake_id": 2})
	waitFor(t, time.Minute, "the normal event delivered and the forged rows decided", func() bool {
		s.RunOnce(ctx)
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND state = 'delivered'`, normal) == 1 &&
			testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND state = 'dead'`, forged) == 2
	})
	for i := 0; i < 5; i++ { // more passes: nothing is sent later either
		s.RunOnce(ctx)
	}
	if hits := b.got(); len(hits) != 0 {
		t.Fatalf("globex's receiver got %d requests for an acme event named by a forged row", len(hits))
	}
	hits := a.got()
	if len(hits) != 1 || hits[0].id != strconv.FormatInt(normal, 10) || !verify("acme-secret", hits[0].sig, hits[0].body, time.Now()) {
		t.Fatalf("acme's receiver got %+v, want the normal event only, signed with acme's secret", hits)
	}
	if verify("pgp-passphrase", hits[0].sig, hits[0].body, time.Now()) {
		t.Fatal("a request was signed with a secret no webhook names")
	}
	rows, err := pool.Query(ctx, `SELECT endpoint_id, attempts, last_error FROM intake_outbox_delivery WHERE event_id = $1 ORDER BY endpoint_id`, forged)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, lastErr string
		var attempts int
		if err := rows.Scan(&id, &attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if attempts != 1 || !strings.Contains(lastErr, `endpoint "`+id+`" is not in the config`) || !strings.Contains(lastErr, "not sent") {
			t.Fatalf("forged delivery to %s: %d attempts, last error %q", id, attempts, lastErr)
		}
	}
	rows.Close()
	if got := sumCounter(t, reg, "intake_notify_deliveries_total", "refused"); got != 2 {
		t.Fatalf("refused deliveries counted %v, want 2", got)
	}
	dead, err := ledger.New(pool, time.Minute).DeadDeliveries(ctx, []string{"acme"}, 10)
	if err != nil || len(dead) != 2 || dead[0].EventID != forged || !strings.Contains(dead[0].LastError, "is not in the config") {
		t.Fatalf("notify dead lists %+v (%v), want the two forged deliveries with their reason", dead, err)
	}
}

// During a rotation a webhook names two secrets: each request carries a
// v1 signature per secret, so the receiver verifies it with either the
// old or the new one (and with no other). The signed body names the
// endpoint, so a request replayed to another endpoint says so. The URL
// and secrets are the config's at send time: a webhook whose URL changes
// by reload, keeping its id, gets its pending delivery at the new URL.
func TestARotationSignsWithBothSecretsAndTheBodyNamesTheEndpoint(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	t.Setenv("HOOK_SECRET_OLD", "old-secret")
	t.Setenv("HOOK_SECRET_NEW", "new-secret")
	before, after := newReceiver(t), newReceiver(t)
	before.failing.Store(true)
	hook := partners.Notify{ID: "ops-hook", URL: before.URL + "/hook", SecretEnv: "HOOK_SECRET_OLD", SecretEnvs: []string{"HOOK_SECRET_NEW"}, Events: []string{"failed"}}
	if m := notify.MissingSecrets([]partners.Notify{hook}, nil); len(m) != 0 {
		t.Fatalf("MissingSecrets %v with both set", m)
	}
	if m := notify.MissingSecrets([]partners.Notify{{ID: "x", URL: "https://x.example/", SecretEnv: "HOOK_SECRET_OLD", SecretEnvs: []string{"HOOK_SECRET_ROTATED_UNSET"}}}, nil); len(m) != 1 || m[0] != "HOOK_SECRET_ROTATED_UNSET" {
		t.Fatalf("MissingSecrets %v: want the unset rotation secret", m)
	}
	parts := []partners.Config{{ID: "acme"}}
	s := notify.New(pool, "a", fast(), []partners.Notify{hook}, parts, prometheus.NewRegistry(), testenv.Logger(t))
	id := event(t, pool, "acme", "failed", map[string]any{"intake_id": 3})
	waitFor(t, time.Minute, "an attempt at the old URL", func() bool { s.RunOnce(ctx); return len(before.got()) > 0 })
	moved := hook
	moved.URL = after.URL + "/hook"
	s.SetConfig([]partners.Notify{moved}, parts)
	waitFor(t, time.Minute, "delivered at the new URL", func() bool {
		s.RunOnce(ctx)
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND endpoint_id = 'ops-hook' AND state = 'delivered'`, id) == 1
	})
	hits := after.got()
	if len(hits) != 1 || !hits[0].ok {
		t.Fatalf("the new URL got %+v, want the delivery once", hits)
	}
	h := hits[0]
	if n := strings.Count(h.sig, ",v1="); n != 2 {
		t.Fatalf("signature header %q: %d v1 signatures, want 2", h.sig, n)
	}
	for _, secret := range []string{"old-secret", "new-secret"} {
		if !verify(secret, h.sig, h.body, time.Now()) {
			t.Fatalf("the receiver holding %q cannot verify %q", secret, h.sig)
		}
	}
	if verify("another-secret", h.sig, h.body, time.Now()) {
		t.Fatal("a signature verifies with a secret the webhook does not name")
	}
	var doc struct {
		ID       int64  `json:"id"`
		Endpoint string `json:"endpoint"`
	}
	if err := json.Unmarshal(h.body, &doc); err != nil || doc.ID != id || doc.Endpoint != "ops-hook" {
		t.Fatalf("body %s: want event %d naming endpoint ops-hook (%v)", h.body, id, err)
	}
	// the same event for another endpoint is another signed body
	other := ledger.Delivery{EventID: id, EndpointID: "other-hook", Partner: "acme", Event: "failed"}
	this := other
	this.EndpointID = "ops-hook"
	if string(notify.Body(other, "")) == string(notify.Body(this, "")) {
		t.Fatal("the body does not depend on the endpoint: a request could be replayed to another endpoint")
	}
}

// Migration 013 on deliveries recorded with their URL: each gets the id
// an endpoint configured without one has (partners.DerivedNotifyID of its
// URL), so the deliveries pending across the upgrade still reach their
// endpoint, also once it is given an id of its own; a delivery whose URL
// no webhook has any more is not sent. The URL and secret_env columns are
// gone. Its down migration refuses while a delivery is pending.
func TestMigrationNamesRecordedDeliveriesByTheirEndpointsID(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	sql := func(name string) string {
		b, err := os.ReadFile("../../migrations/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	down, up := sql("013_webhook_endpoint.down.sql"), sql("013_webhook_endpoint.up.sql")
	ev := event(t, pool, "acme", "failed", map[string]any{"intake_id": 4})
	if _, err := pool.Exec(ctx, `UPDATE intake_outbox SET fanned_out = true`); err != nil { // fanned out before the upgrade
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, endpoint_id) VALUES ($1, 'ops')`, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, down); err == nil || !strings.Contains(err.Error(), "webhook deliveries are pending") {
		t.Fatalf("down with a pending delivery: %v", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE intake_outbox_delivery SET state = 'delivered'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, down); err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t)
	urls := []string{"https://hooks.example.com/intake?token=é", r.URL + "/hook"}
	for _, u := range urls {
		if _, err := pool.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, url, secret_env) VALUES ($1, $2, 'INTAKE_WEBHOOK_SECRET')`, ev, u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, up); err != nil {
		t.Fatal(err)
	}
	got := testenv.Strings(t, pool, `SELECT endpoint_id FROM intake_outbox_delivery WHERE state = 'pending' ORDER BY endpoint_id`)
	want := []string{partners.DerivedNotifyID(urls[0]), partners.DerivedNotifyID(urls[1])}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("backfilled endpoint ids %v, want %v", got, want)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'intake_outbox_delivery' AND column_name IN ('url', 'secret_env')`); n != 0 {
		t.Fatalf("%d of url, secret_env left on intake_outbox_delivery", n)
	}
	t.Setenv("HOOK_SECRET", "s")
	hook := partners.Notify{ID: "local-hook", URL: urls[1], SecretEnv: "HOOK_SECRET", Events: []string{"failed"}}
	s := notify.New(pool, "a", fast(), []partners.Notify{hook}, []partners.Config{{ID: "acme"}}, prometheus.NewRegistry(), testenv.Logger(t))
	waitFor(t, time.Minute, "the recorded deliveries decided", func() bool {
		s.RunOnce(ctx)
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox_delivery WHERE state = 'pending'`) == 0
	})
	if st := testenv.Strings(t, pool, `SELECT state FROM intake_outbox_delivery WHERE endpoint_id = $1`, partners.DerivedNotifyID(urls[1])); len(st) != 1 || st[0] != "delivered" {
		t.Fatalf("the delivery recorded for %s: %v, want delivered", urls[1], st)
	}
	if st := testenv.Strings(t, pool, `SELECT state FROM intake_outbox_delivery WHERE endpoint_id = $1`, partners.DerivedNotifyID(urls[0])); len(st) != 1 || st[0] != "dead" {
		t.Fatalf("the delivery recorded for a URL no webhook has: %v, want dead", st)
	}
	if hits := r.got(); len(hits) != 1 || !verify("s", hits[0].sig, hits[0].body, time.Now()) {
		t.Fatalf("receiver got %+v, want the recorded delivery once, signed", hits)
	}
}
