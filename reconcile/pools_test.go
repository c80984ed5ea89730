package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
)

// onePool is a pool on url that holds one connection at most.
func onePool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	return testenv.PoolWith(t, url, func(pc *pgxpool.Config) { pc.MaxConns = 1 })
}

// A run holds one connection of the work pool at a time, whatever it
// does: its leader lock lives on a connection of its own and its claim
// sections on the claim pool. A run that held the lock, or a claim
// section, on the work pool and needed a statement there too waited for
// good on a pool of database.max_conns' smallest size, and so did every
// poll of its daemon. Here the work pool and the claim pool hold one
// connection each, and the run takes an expired lease over and adopts an
// orphaned claim, each in a claim section.
func TestARunHoldsOneConnectionOfTheWorkPoolAtATime(t *testing.T) {
	url, pool := testenv.DB(t)
	lease, orph := bigSite(t, "lease", 100), testenv.NewSite(t, "orph")
	lease.Drop(t, "orders-l.csv", testenv.OrdersCSV("L", 250))
	orph.Drop(t, "orders-o.csv", testenv.OrdersCSV("O", 5))
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, lease, orph)
	stoppedAt(t, w1, "lease", "apply:after_commit")
	stoppedAt(t, w1, "orph", "claim:after_rename")
	fault.Set("")
	expireLeases(t, pool)

	w2 := newNode(t, pool, "w2", spoolDir, lease, orph)
	rec, err := reconcile.New(reconcile.Config{}, "w2", 10*time.Second, onePool(t, url), w2.sp,
		[]partners.Config{lease.Validated(t), orph.Validated(t)}, prometheus.NewRegistry(), testenv.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec.WithClaimPool(onePool(t, url))
	defer rec.Stop()
	// a deadline that only a run waiting for good reaches
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs, err := rec.RunOnce(ctx)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	k := kinds(fs)
	if k[ledger.KindLeaseExpired] != 1 || k[ledger.KindOrphanClaim] != 1 {
		t.Fatalf("findings %+v, want one lease taken over and one orphan adopted", fs)
	}
	for _, f := range fs {
		if f.Kind == ledger.KindOrphanClaim && f.IntakeID == 0 {
			t.Fatalf("the orphan was not adopted: %+v", f)
		}
	}
	for _, p := range []string{"lease", "orph"} {
		if err := w2.poll(t, p); err != nil {
			t.Fatal(err)
		}
	}
	testenv.AssertExactOrders(t, pool, "lease", 250, "L")
	testenv.AssertExactOrders(t, pool, "orph", 5, "O")
	// the run gave its lock up: another run leads again
	if _, err := rec.RunOnce(ctx); err != nil {
		t.Fatalf("second run: %v", err)
	}
}
