package intake_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
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
