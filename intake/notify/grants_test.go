package notify_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Webhooks are fanned out and delivered on the daemon's grants (intake
// grants): as the daemon's role a pass fans an event out to its endpoint,
// posts it and records the delivery.
func TestDeliveryRunsOnTheDaemonsGrants(t *testing.T) {
	url, admin := testenv.DB(t)
	pool := testenv.GrantRoles(t, url, admin, "").DaemonPool(t)
	t.Setenv("HOOK_SECRET_G", "global-secret")
	g := newReceiver(t)
	global := []partners.Notify{{URL: g.URL + "/hook", SecretEnv: "HOOK_SECRET_G", Events: []string{"quarantined"}}}
	ev := event(t, admin, "acme", "quarantined", map[string]any{"intake_id": 7, "reason": "header_mismatch"})
	s := notify.New(pool, "a", fast(), global, nil, prometheus.NewRegistry(), testenv.Logger(t))
	s.RunOnce(context.Background())
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_outbox_delivery WHERE event_id = $1 AND state = 'delivered'`, ev); n != 1 {
		t.Fatalf("%d deliveries of event %d delivered, want 1", n, ev)
	}
	if hits := g.got(); len(hits) != 1 || !hits[0].ok {
		t.Errorf("the endpoint got %+v, want the event once", hits)
	}
}
