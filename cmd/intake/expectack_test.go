package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// `intake expect ack PARTNER/FEED WINDOW --reason …` acknowledges a late
// window: `intake status` no longer asks for attention for it and says who
// acknowledged it; a second ack exits 1 naming the first, and a malformed
// window, an unknown feed or a missing reason are usage errors.
func TestExpectAckTakesALateWindowOutOfStatus(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "ackops")
	cfg := writeConfig(t, site, "")
	sched := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	if _, err := pool.Exec(context.Background(), `INSERT INTO intake_feed_late (partner_id, feed, scheduled_at, deadline, raised_by)
		VALUES ('ackops', 'orders', $1, $2, 'w1')`, sched, sched.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	window := sched.Format(time.RFC3339)
	if code, out := runCLI("status", "--config", cfg, "--partner", "ackops"); code != 1 ||
		!strings.Contains(out, "late delivery: feed orders") || !strings.Contains(out, "intake expect ack ackops/orders "+window) {
		t.Fatalf("status before the ack: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"expect", "ack", "ackops/orders", "yesterday", "--config", cfg, "--reason", "x"}, "not an RFC 3339 time"},
		{[]string{"expect", "ack", "ackops-orders", window, "--config", cfg, "--reason", "x"}, "is not PARTNER/FEED"},
		{[]string{"expect", "ack", "ackops/stock", window, "--config", cfg, "--reason", "x"}, `has no feed "stock"`},
		{[]string{"expect", "ack", "ackops/orders", window, "--config", cfg}, "--reason TEXT is required"},
	} {
		if code, out := runCLI(c.args...); code != 2 || !strings.Contains(out, c.want) {
			t.Fatalf("%v: exit %d, want 2 and %q\n%s", c.args, code, c.want, out)
		}
	}
	if code, out := runCLI("expect", "ack", "ackops/orders", window, "--config", cfg, "--reason", "partner closed that day", "--actor", "oncall"); code != 0 ||
		!strings.Contains(out, "acknowledged by oncall") {
		t.Fatalf("expect ack: exit %d\n%s", code, out)
	}
	code, out := runCLI("status", "--config", cfg, "--partner", "ackops")
	if strings.Contains(out, "late delivery: feed") || !strings.Contains(out, "late delivery acknowledged: feed orders, window scheduled "+window+", by oncall") {
		t.Fatalf("status after the ack: exit %d\n%s", code, out)
	}
	if code, out := runCLI("expect", "ack", "ackops/orders", window, "--config", cfg, "--reason", "again", "--actor", "other"); code != exitRefused ||
		!strings.Contains(out, "already acknowledged: by oncall") {
		t.Fatalf("second expect ack: exit %d\n%s", code, out)
	}
}
