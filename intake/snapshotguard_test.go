package intake_test

import (
	"context"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A snapshot cut short (truncated at a line boundary, a partial export)
// would delete most of the partner's rows. Every snapshot feed has a
// delete guard unless its config turns it off: such a plan waits in
// awaiting_approval, nothing deleted, until ops approve the plan shown;
// a snapshot of fewer rows than the guard's min_rows waits likewise.
func TestASnapshotThatWouldDeleteMostOfATableWaits(t *testing.T) {
	cases := []struct {
		name  string
		guard *partners.DeleteGuard
		rows  int    // of the second snapshot, after one of 20
		waits string // what the audit says of the wait; "" applies at once
	}{
		{"default guard", nil, 2, "18 deletes of the 20 rows the feed holds, more than delete_guard.max_share 0.1"},
		{"within the default share", nil, 19, ""},
		{"min_rows", &partners.DeleteGuard{MinRows: 10, MaxShare: ratio(1)}, 9, "a snapshot of 9 rows, fewer than delete_guard.min_rows 10"},
		{"off", &partners.DeleteGuard{Off: true}, 2, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "sg")
			site.Config.Feeds[0].Mode = partners.ModeSnapshot
			site.Config.Feeds[0].DeleteGuard = c.guard
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-1.csv", goodRows("G", 20))
			r.poll("sg")
			if f := files(t, pool, "sg")[0]; f.State != "archived" || f.Applied != 20 {
				t.Fatalf("first snapshot %+v, want 20 rows applied (nothing to delete)", f)
			}
			site.Drop(t, "orders-2.csv", goodRows("G", c.rows))
			r.poll("sg")
			f := files(t, pool, "sg")[1]
			if c.waits == "" {
				if f.State != "archived" {
					t.Fatalf("second snapshot %+v, want it applied at once", f)
				}
				if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sg'`); n != int64(c.rows) {
					t.Fatalf("target holds %d rows, want %d", n, c.rows)
				}
				return
			}
			if f.State != "awaiting_approval" {
				t.Fatalf("second snapshot %+v, want it waiting for approval", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sg'`); n != 20 {
				t.Fatalf("target holds %d rows while the snapshot waits, want all 20", n)
			}
			if a := strings.Join(testenv.Strings(t, pool, `SELECT coalesce(detail, '') FROM intake_audit WHERE intake_id = $1`, f.ID), "\n"); !strings.Contains(a, c.waits) {
				t.Fatalf("audit %q does not say why the plan waits (%q)", a, c.waits)
			}
			v, counts := planOf(t, pool, "sg", f.ID)
			if counts.Deletes != int64(20-c.rows) {
				t.Fatalf("plan %+v, want %d deletes", counts, 20-c.rows)
			}
			if err := approve(ctx, pool, "sg", f.ID, v.Hash); err != nil {
				t.Fatal(err)
			}
			r.poll("sg")
			if f := files(t, pool, "sg")[1]; f.State != "archived" {
				t.Fatalf("approved snapshot %+v, want it applied", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sg'`); n != int64(c.rows) {
				t.Fatalf("target holds %d rows after the approved snapshot, want %d", n, c.rows)
			}
		})
	}
}
