package affinity_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/affinity"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/rendezvous"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A read of the live replicas that waits (here on a lock of their table)
// holds up no other question: another partner's poll gate and a lost
// claim are answered at once from the view before, and the read's own
// question gets the new view once it ends.
func TestAReadOfTheLiveReplicasHoldsUpNoOtherQuestion(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := ledger.New(pool, time.Minute)
	for _, w := range []string{"w1", "w2"} {
		if _, err := l.RegisterWorker(ctx, w, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	reads := make(chan map[string][]string, 4)
	p := affinity.New(affinity.Config{Ledger: l, WorkerID: "w1", Lease: time.Minute,
		Registered: func() bool { return true }, Partners: func() []string { return []string{"a", "b"} },
		Gained: func(string) {}, Seen: func(m map[string][]string) { reads <- m },
		Owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "owned"}, []string{"partner"}), Log: testenv.Logger(t)})
	owner := func(partner string) bool { return rendezvous.Owner(partner, []string{"w1", "w2"}) == "w1" }
	if got := p.Owns(ctx, "a"); got != owner("a") {
		t.Fatalf("owns a: %v, want %v", got, owner("a"))
	}
	if v := <-reads; len(v["a"]) != 2 {
		t.Fatalf("first view %v, want both replicas serving a", v)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `LOCK TABLE intake_worker IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	p.Expire()
	slow := make(chan bool, 1)
	go func() { slow <- p.Owns(ctx, "a") }()
	testenv.WaitFor(t, time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM intake_worker%'`) == 1
	}, testenv.Says("the read of the live replicas never waited on the lock"))

	quick := make(chan bool, 1)
	go func() {
		p.Lost()
		quick <- p.Owns(ctx, "b")
	}()
	select {
	case got := <-quick:
		if got != owner("b") {
			t.Fatalf("owns b from the view before: %v, want %v", got, owner("b"))
		}
	case <-slow:
		t.Fatal("the read ended while the table was locked")
	case <-ctx.Done():
		t.Fatal("another partner's question waited on the read in progress")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-slow; got != owner("a") {
		t.Fatalf("owns a after the read: %v, want %v", got, owner("a"))
	}
	if v := <-reads; len(v["b"]) != 2 {
		t.Fatalf("second view %v, want both replicas serving b", v)
	}
}
