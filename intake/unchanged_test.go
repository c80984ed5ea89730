package intake_test

import (
	"context"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A file whose rows the target mostly holds already: the look-up leaves
// the unchanged rows out of every chunk's merge, and each row still gets
// the outcome the merge gives it (updated, inserted, a newer write's
// conflict, unchanged and never rewritten). A file of changed rows looks
// up its first chunk, then merges the next unchangedPause chunks whole.
func TestRowsTheTargetHoldsAreLeftOutOfTheMerge(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 10
	r := newRig(t, pool, "w1", site)
	looked := &intake.Signals(r.d).Unchanged
	looked.Init(t)
	drain := func() (n, rows, kept int) {
		for {
			select {
			case l := <-looked.C():
				n, rows, kept = n+1, rows+l.Rows, kept+l.Kept
			default:
				return
			}
		}
	}
	site.Drop(t, "orders-r1.csv", goodRows("R", 100))
	r.poll("acme")
	if n, _, _ := drain(); n != 0 {
		t.Fatalf("a fresh file of new keys was looked up %d times: its chunks go straight in", n)
	}
	first := files(t, pool, "acme")[0].ID
	// a newer intake wrote R-15 since
	if _, err := pool.Exec(ctx, `UPDATE orders SET amount = 9.99, last_intake_id = 1000000 WHERE order_id = 'R-15'`); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(goodRows("R", 100), "\n")
	lines[3] = ordersLine("R", 3, "3.33") // lines[0] is the header
	body := strings.Join(lines, "") + ordersLine("R", 101, "")
	site.Drop(t, "orders-r2.csv", body)
	r.poll("acme")
	f := files(t, pool, "acme")[1]
	if f.State != "archived" || f.Applied != 2 || f.Confl != 1 || f.Unchanged != 98 {
		t.Fatalf("got %+v, want 2 applied (R-3 updated, R-101 inserted), 1 conflict (R-15), 98 unchanged", f)
	}
	n, rows, kept := drain()
	if n != 11 || rows != 101 || kept != 3 {
		t.Fatalf("look-ups: %d of %d rows, %d left to the merge; want 11 of 101, 3 left (R-3, R-15, R-101)", n, rows, kept)
	}
	for key, want := range map[string]string{"R-3": "3.33", "R-15": "9.99", "R-101": "1010.01", "R-4": "40.04"} {
		var got string
		if err := pool.QueryRow(ctx, `SELECT amount::text FROM orders WHERE partner_id = 'acme' AND order_id = $1`, key).Scan(&got); err != nil || got != want {
			t.Errorf("%s: amount %q (%v), want %s", key, got, err, want)
		}
	}
	if c := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND last_intake_id = $1`, first); c != 98 {
		t.Fatalf("%d rows still carry the first intake, want 98 (unchanged rows are never rewritten)", c)
	}
	// every row changed: the first chunk is looked up, the next
	// unchangedPause are merged whole, the last is looked up again
	var changed strings.Builder
	changed.WriteString(header)
	for i := 1; i <= 100; i++ {
		changed.WriteString(ordersLine("R", i, "1.00"))
	}
	site.Drop(t, "orders-r3.csv", changed.String())
	r.poll("acme")
	f = files(t, pool, "acme")[2]
	if f.State != "archived" || f.Applied != 99 || f.Confl != 1 || f.Unchanged != 0 {
		t.Fatalf("got %+v, want 99 applied, 1 conflict (R-15)", f)
	}
	if n, rows, kept := drain(); n != 2 || rows != 20 || kept != 20 {
		t.Fatalf("look-ups of a changed file: %d of %d rows, %d left to the merge; want 2 of 20, all left", n, rows, kept)
	}
}
