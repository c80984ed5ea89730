package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Two partners send files with the same names, batch ids and row keys into
// the same target table. Neither sees or affects the other's files, spool
// entries, rows, reports or quarantine; a daemon configured for one never
// touches the other's site.
func TestPartnersAreIsolated(t *testing.T) {
	_, pool := testenv.DB(t)
	a := testenv.NewSite(t, "alpha")
	b := testenv.NewSite(t, "beta")
	aRows := testenv.OrdersCSV("X", 3)
	bRows := strings.ReplaceAll(testenv.OrdersCSV("X", 3), "paid", "new")
	a.Drop(t, "orders-same.csv", aRows)
	b.Drop(t, "orders-same.csv", bRows)

	onlyA := newRig(t, pool, "w1", a)
	onlyA.poll("alpha")
	if got := b.Files(t, "ready"); len(got) != 1 {
		t.Fatalf("a daemon for alpha touched beta's site: ready/ holds %v", got)
	}
	if fs := files(t, pool, "beta"); len(fs) != 0 {
		t.Fatalf("beta has intake rows from alpha's daemon: %+v", fs)
	}

	both := newRig(t, pool, "w2", a, b)
	both.poll("beta")
	fa, fb := files(t, pool, "alpha"), files(t, pool, "beta")
	if len(fa) != 1 || len(fb) != 1 || fa[0].State != "archived" || fb[0].State != "archived" {
		t.Fatalf("alpha %+v beta %+v: the same batch id from two partners is no conflict", fa, fb)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id LIKE 'X-%'`); n != 6 {
		t.Fatalf("%d rows, want 3 per partner", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'alpha' AND status = 'paid'`); n != 3 {
		t.Fatal("alpha's rows were changed by beta's file")
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'beta' AND status = 'new'`); n != 3 {
		t.Fatal("beta's rows are not beta's values")
	}

	// alpha resends other bytes under the same batch: only alpha's file is held
	a.Drop(t, "orders-same.csv", strings.Replace(aRows, "10.01", "99.99", 1))
	both.poll("alpha")
	fa = files(t, pool, "alpha")
	if fa[1].State != "quarantined" || fa[1].Reason != "batch_conflict" {
		t.Fatalf("alpha's resend: %+v", fa[1])
	}
	if got := b.Files(t, "quarantine"); len(got) != 0 {
		t.Fatalf("beta's quarantine holds %v", got)
	}
	for _, site := range []struct {
		s    *testenv.Site
		mine []testenv.FileRow
	}{{a, fa}, {b, fb}} {
		for _, rep := range site.s.Files(t, "reports") {
			owned := false
			for _, f := range site.mine {
				if filepath.Base(f.Receipt) == filepath.Base(rep) {
					owned = true
				}
			}
			if !owned {
				t.Fatalf("%s's reports hold %s, which is not one of its files", site.s.Config.ID, rep)
			}
		}
	}
	// spool entries live under each partner's own directory (both's spool
	// saw alpha's resend and beta's file)
	ents, _ := os.ReadDir(filepath.Join(both.spoolDir, "alpha", "sha256"))
	bents, _ := os.ReadDir(filepath.Join(both.spoolDir, "beta", "sha256"))
	if len(bents) != 1 || len(ents) != 1 {
		t.Fatalf("spool: alpha %v, beta %v: want each partner's bytes under its own directory", ents, bents)
	}
}

// Two partners with a feed of the same name writing one table, their
// columns in another order: every row holds its own partner's values in
// the right columns, through the per-file path and through a group. (The
// daemon's target cache was keyed by table and feed name, so the second
// partner's file was written with the first partner's column list.)
func TestSameFeedNameInAnotherColumnOrder(t *testing.T) {
	_, pool := testenv.DB(t)
	a := testenv.NewSite(t, "alpha")
	b := testenv.NewSite(t, "beta")
	rev := testenv.OrdersFeed()
	slices.Reverse(rev.Columns)
	b.Config.Feeds = []partners.Feed{rev}

	// alpha's file goes alone; beta's two small files go as a group, and
	// a third alone after them
	a.Drop(t, "orders-a1.csv", testenv.OrdersCSV("A", 3))
	reversed := func(prefix string, from, n int) string {
		var s strings.Builder
		s.WriteString("qty,placed_at,status,amount,email,order_id\n")
		for i := from; i < from+n; i++ {
			fmt.Fprintf(&s, "%d,2026-10-%02dT08:30:00Z,shipped,%d.5,%s%d@beta.example,%s-%d\n", 100+i, i, 7*i, strings.ToLower(prefix), i, prefix, i)
		}
		return s.String()
	}
	b.Drop(t, "orders-b1.csv", reversed("B", 1, 3))
	b.Drop(t, "orders-b2.csv", reversed("B", 4, 3))
	r := newRig(t, pool, "w1", a, b)
	r.poll("alpha")
	r.poll("beta")
	b.Drop(t, "orders-b3.csv", reversed("B", 7, 2))
	r.poll("beta")

	for _, p := range []string{"alpha", "beta"} {
		for _, f := range files(t, pool, p) {
			if f.State != "archived" || f.Applied != f.Total || f.Rejected != 0 {
				t.Fatalf("%s: %+v", p, f)
			}
		}
	}
	type row struct {
		id, email, amount, status, placed string
		qty                               int64
	}
	read := func(partner string) []row {
		rs, err := pool.Query(context.Background(), `SELECT order_id, email, amount::text, status,
			to_char(placed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), qty
			FROM orders WHERE partner_id = $1 ORDER BY length(order_id), order_id`, partner)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var out []row
		for rs.Next() {
			var x row
			if err := rs.Scan(&x.id, &x.email, &x.amount, &x.status, &x.placed, &x.qty); err != nil {
				t.Fatal(err)
			}
			out = append(out, x)
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	var wantA, wantB []row
	for i := 1; i <= 3; i++ {
		wantA = append(wantA, row{fmt.Sprintf("A-%d", i), fmt.Sprintf("c%d@example.com", i), fmt.Sprintf("%d.%02d", i*10, i),
			"paid", fmt.Sprintf("2026-11-0%dT10:00:00Z", 1+i%9), int64(i)})
	}
	for i := 1; i <= 8; i++ {
		wantB = append(wantB, row{fmt.Sprintf("B-%d", i), fmt.Sprintf("b%d@beta.example", i), fmt.Sprintf("%d.50", 7*i),
			"shipped", fmt.Sprintf("2026-10-%02dT08:30:00Z", i), int64(100 + i)})
	}
	if got := read("alpha"); !slices.Equal(got, wantA) {
		t.Fatalf("alpha's rows:\n got %+v\nwant %+v", got, wantA)
	}
	if got := read("beta"); !slices.Equal(got, wantB) {
		t.Fatalf("beta's rows:\n got %+v\nwant %+v", got, wantB)
	}
}
