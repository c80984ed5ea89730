package expect_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Two daily windows are missed; ops acknowledge the first: it stops
// counting (gauge, status), the acknowledgement is audited once, a second
// acknowledgement and one of a window that was never late are refused, a
// file that arrives late for the acknowledged window still closes it, and
// a window a late file closed cannot be acknowledged.
func TestAnAcknowledgedLateWindowStopsCounting(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	r, at := dailyReplica(t, pool)
	r.run(t, at(0, 5, 0))
	r.run(t, at(1, 8, 0).Add(2*time.Second)) // day 0 and day 1: no file
	if got := lateRows(t, pool); len(got) != 2 {
		t.Fatalf("want days 0 and 1 late: %+v", got)
	}
	if g := r.metric(t, "intake_feed_late"); g != 2 {
		t.Fatalf("intake_feed_late %v, want 2", g)
	}

	w, err := ops.AckLate(ctx, pool, "acme", "orders", at(0, 6, 0), "oncall", "partner closed that day", "")
	if err != nil {
		t.Fatal(err)
	}
	if !w.Scheduled.Equal(at(0, 6, 0)) || w.AckedBy != "oncall" || w.AckedAt == nil {
		t.Fatalf("ack returned %+v", w)
	}
	r.run(t, at(1, 9, 0))
	if g := r.metric(t, "intake_feed_late"); g != 1 {
		t.Fatalf("intake_feed_late %v after the ack, want 1 (day 1 only)", g)
	}
	st, err := ops.Status(ctx, pool, []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	open, acked := 0, 0
	for _, l := range st[0].Late {
		switch {
		case l.AckedAt != nil && l.Scheduled.Equal(at(0, 6, 0)) && l.AckReason == "partner closed that day":
			acked++
		case l.AckedAt == nil && l.ClosedBy == 0 && l.Scheduled.Equal(at(1, 6, 0)):
			open++
		default:
			t.Fatalf("status shows an unexpected late window: %+v", l)
		}
	}
	if open != 1 || acked != 1 {
		t.Fatalf("status: %d open, %d acknowledged; want 1 and 1: %+v", open, acked, st[0].Late)
	}

	if _, err := ops.AckLate(ctx, pool, "acme", "orders", at(0, 6, 0), "someone-else", "again", ""); !errors.Is(err, ledger.ErrLateAcked) ||
		!strings.Contains(err.Error(), "oncall") {
		t.Fatalf("a second ack: %v, want it refused naming the first", err)
	}
	if _, err := ops.AckLate(ctx, pool, "acme", "orders", at(0, 7, 0), "oncall", "typo", ""); !errors.Is(err, ledger.ErrLateUnknown) {
		t.Fatalf("ack of a time that is no late window: %v, want ErrLateUnknown", err)
	}
	if _, err := ops.AckLate(ctx, pool, "acme", "stock", at(0, 6, 0), "oncall", "other feed", ""); !errors.Is(err, ledger.ErrLateUnknown) {
		t.Fatalf("ack of another feed's window: %v, want ErrLateUnknown", err)
	}
	var audits int
	var actor, reason, detail string
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.count(*) OVER (), actor, reason, detail FROM intake_audit
		WHERE action = 'expect_ack' AND partner_id = 'acme'`).Scan(&audits, &actor, &reason, &detail); err != nil {
		t.Fatal(err)
	}
	if audits != 1 || actor != "oncall" || reason != "partner closed that day" ||
		!strings.Contains(detail, "orders") || !strings.Contains(detail, at(0, 6, 0).Format(time.RFC3339)) {
		t.Fatalf("audit: %d row(s), %q %q %q", audits, actor, reason, detail)
	}
	var by string
	if err := pool.QueryRow(ctx, `SELECT acked_by FROM intake_feed_late WHERE partner_id = 'acme' AND scheduled_at = $1`, at(0, 6, 0)).Scan(&by); err != nil || by != "oncall" {
		t.Fatalf("acked_by %q after a refused second ack (%v)", by, err)
	}

	// Late files for both windows: each closes its own window, the
	// acknowledged one included.
	first := addFile(t, pool, "archived", at(0, 20, 0))
	second := addFile(t, pool, "archived", at(1, 20, 0))
	r.run(t, at(1, 23, 0))
	got := lateRows(t, pool)
	if len(got) != 2 || got[0].ClosedBy != first || got[1].ClosedBy != second {
		t.Fatalf("want day 0 closed by %d, day 1 by %d: %+v", first, second, got)
	}
	if g := r.metric(t, "intake_feed_late"); g != 0 {
		t.Fatalf("intake_feed_late %v, want 0", g)
	}
	if _, err := ops.AckLate(ctx, pool, "acme", "orders", at(1, 6, 0), "oncall", "too late", ""); !errors.Is(err, ledger.ErrLateNotOpen) {
		t.Fatalf("ack of a window a late file closed: %v, want ErrLateClosed", err)
	}
}
