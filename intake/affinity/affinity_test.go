package affinity_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
		if _, err := l.RegisterWorker(ctx, w, []string{"a", "b"}, holdID(t, pool, w)); err != nil {
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

// peers is a Peers of replica w1 that reports each view it reads, with w1
// and w2 registered serving partners p00..p19.
func peers(t *testing.T, ctx context.Context) (*affinity.Peers, *pgxpool.Pool, chan map[string][]string, []string) {
	t.Helper()
	return peersGaining(t, ctx, func(string) {}, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "owned"}, []string{"partner"}))
}

// peersGaining is peers with gained told of every partner a view gives
// this replica that the view before did not, and owned the gauge of the
// partners it polls.
func peersGaining(t *testing.T, ctx context.Context, gained func(string), owned *prometheus.GaugeVec) (*affinity.Peers, *pgxpool.Pool, chan map[string][]string, []string) {
	t.Helper()
	_, pool := testenv.DB(t)
	l := ledger.New(pool, time.Minute)
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, fmt.Sprintf("p%02d", i))
	}
	for _, w := range []string{"w1", "w2"} {
		if _, err := l.RegisterWorker(ctx, w, ids, holdID(t, pool, w)); err != nil {
			t.Fatal(err)
		}
	}
	reads := make(chan map[string][]string, 8)
	p := affinity.New(affinity.Config{Ledger: l, WorkerID: "w1", Lease: time.Minute,
		Registered: func() bool { return true }, Partners: func() []string { return ids },
		Gained: gained, Seen: func(m map[string][]string) { reads <- m },
		Owned: owned, Log: testenv.Logger(t)})
	return p, pool, reads, ids
}

// lockReplicas holds intake_worker locked until the returned func; reads
// of the live replicas wait meanwhile.
func lockReplicas(t *testing.T, ctx context.Context, pool *pgxpool.Pool) func() {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `LOCK TABLE intake_worker IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// readWaitingFor is how long the read of the live replicas waiting on a
// lock has waited, as the database's clock says (0: none waits).
func readWaitingFor(t *testing.T, pool *pgxpool.Pool) time.Duration {
	t.Helper()
	var d time.Duration
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(pg_catalog.clock_timestamp() - query_start), '0') FROM pg_catalog.pg_stat_activity
		WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM intake_worker%'`).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// readsWaiting counts the reads of the live replicas waiting on a lock.
func readsWaiting(t *testing.T, pool *pgxpool.Pool) int64 {
	return testenv.Count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM intake_worker%'`)
}

// Before the first view, a question waits for the read in progress. When
// that read ends with its own asker's end, no view came of it: a question
// still waiting reads the replicas itself rather than answer without a
// view (which polls every partner on every replica).
func TestAQuestionWaitingForTheFirstViewReadsItWhenTheFirstReaderGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, pool, reads, ids := peers(t, ctx)
	theirs := w2s(ids)
	unlock := lockReplicas(t, ctx, pool)

	firstCtx, firstEnd := context.WithCancel(ctx)
	first := make(chan bool, 1)
	go func() { first <- p.Owns(firstCtx, theirs) }()
	testenv.WaitFor(t, time.Minute, func() bool { return readsWaiting(t, pool) == 1 },
		testenv.Says("the first read never waited on the lock"))
	second := make(chan bool, 1)
	go func() { second <- p.Owns(ctx, theirs) }()
	testenv.WaitFor(t, time.Minute, func() bool { return waitingInView() == 1 },
		testenv.Says("the second question never waited for the first read"))

	firstEnd()
	if got := <-first; !got {
		t.Fatal("a question cut short by its own end answered without polling")
	}
	// the second question reads now: a read of its own waits on the lock
	waitUnanswered(t, second, "without a view", func() bool {
		return readsWaiting(t, pool) == 1 && strings.Count(testenv.Stacks(), "ledger.(*leaseStore).LiveServing(") == 1
	}, "the waiting question never read the replicas")
	unlock()
	if got := <-second; got {
		t.Fatalf("owns %s, which rendezvous gives w2", theirs)
	}
	if v := <-reads; len(v[theirs]) != 2 {
		t.Fatalf("view %v, want both replicas serving %s", v, theirs)
	}
}

// A replica whose view is older than a lease (paused past it, its
// partners' owners may have changed meanwhile) does not act on it: a
// question asked while the next view is read waits for that read, and
// answers from it.
func TestAViewOlderThanALeaseIsNotActedOnWhileTheNextIsRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, pool, reads, ids := peers(t, ctx)
	theirs := w2s(ids)
	if p.Owns(ctx, theirs) {
		t.Fatalf("owns %s, which rendezvous gives w2", theirs)
	}
	<-reads
	p.Age(2 * time.Minute)
	// w2's lease runs out while the next read waits on the table
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `LOCK TABLE intake_worker IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE intake_worker SET last_seen = pg_catalog.now() - interval '1 hour' WHERE worker_id = 'w2'`); err != nil {
		t.Fatal(err)
	}
	first := make(chan bool, 1)
	go func() { first <- p.Owns(ctx, theirs) }()
	testenv.WaitFor(t, time.Minute, func() bool { return readsWaiting(t, pool) == 1 },
		testenv.Says("the read never waited on the lock"))
	second := make(chan bool, 1)
	go func() { second <- p.Owns(ctx, theirs) }()
	waitUnanswered(t, second, "from a view older than a lease while the next was read", func() bool { return waitingInView() == 1 },
		"the second question never waited for the read")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !<-first || !<-second {
		t.Fatalf("%s not owned once w2's lease ran out", theirs)
	}
	if v := <-reads; len(v[theirs]) != 1 {
		t.Fatalf("view %v, want w1 alone serving %s", v, theirs)
	}
}

// A failed read between two views does not hide what the second gives
// this replica: the partners of a replica whose lease ran out meanwhile
// are counted against the last view read, and polled at once.
func TestAFailedReadBetweenTwoViewsLosesNoGain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gained := make(chan string, 32)
	owned := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "owned"}, []string{"partner"})
	p, pool, reads, ids := peersGaining(t, ctx, func(id string) { gained <- id }, owned)
	theirs := w2s(ids)
	if p.Owns(ctx, theirs) {
		t.Fatalf("owns %s, which rendezvous gives w2", theirs)
	}
	<-reads
	// a read that fails: cancelled by the database while it waits
	p.Expire()
	unlock := lockReplicas(t, ctx, pool)
	failed := make(chan bool, 1)
	go func() { failed <- p.Owns(ctx, theirs) }()
	testenv.WaitFor(t, time.Minute, func() bool { return readsWaiting(t, pool) == 1 },
		testenv.Says("the read never waited on the lock"))
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.pg_cancel_backend(pid) FROM pg_catalog.pg_stat_activity
		WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM intake_worker%'`); err != nil {
		t.Fatal(err)
	}
	if !<-failed {
		t.Fatal("a question whose read failed did not poll")
	}
	if v := testutil.ToFloat64(owned.WithLabelValues(theirs)); v != 1 {
		t.Fatalf("owned{partner=%s} = %v while every partner is polled (the view unknown)", theirs, v)
	}
	if v := <-reads; v != nil {
		t.Fatalf("the cancelled read gave a view: %v", v)
	}
	unlock()
	// w2's lease runs out; the next view gives its partners to w1
	if _, err := pool.Exec(ctx, `UPDATE intake_worker SET last_seen = pg_catalog.now() - interval '1 hour' WHERE worker_id = 'w2'`); err != nil {
		t.Fatal(err)
	}
	p.Expire()
	if !p.Owns(ctx, theirs) {
		t.Fatalf("%s not owned once w2's lease ran out", theirs)
	}
	<-reads
	for got := map[string]bool{}; !got[theirs]; {
		select {
		case id := <-gained:
			got[id] = true
		default:
			t.Fatalf("%s was not told gained (%v)", theirs, got)
		}
	}
}

// A view requested (Expire, or a lost claim long enough after the read
// began) while a read is in progress is not satisfied by that read: the
// next question reads the replicas again.
func TestAViewRequestedDuringAReadIsReadAgain(t *testing.T) {
	for _, ask := range []string{"expire", "lost"} {
		t.Run(ask, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			p, pool, reads, ids := peers(t, ctx)
			p.Owns(ctx, ids[0])
			<-reads
			unlock := lockReplicas(t, ctx, pool)
			p.Expire()
			slow := make(chan bool, 1)
			go func() { slow <- p.Owns(ctx, ids[0]) }()
			testenv.WaitFor(t, time.Minute, func() bool { return readsWaiting(t, pool) == 1 },
				testenv.Says("the read never waited on the lock"))
			if ask == "expire" {
				p.Expire()
			} else {
				// a lost claim refreshes a view at least peerLostRefresh
				// (200 ms) old: the read in progress is older, as the
				// database dates its statement
				testenv.WaitFor(t, time.Minute, func() bool { return readWaitingFor(t, pool) > 300*time.Millisecond },
					testenv.Says("the read never grew 300 ms old"))
				p.Lost()
			}
			unlock()
			<-slow
			<-reads
			p.Owns(ctx, ids[1])
			select {
			case <-reads:
			default:
				t.Fatal("the view read before the request was taken as fresh")
			}
		})
	}
}

// waitingInView counts the goroutines blocked in view's select: questions
// waiting for a read another question makes.
func waitingInView() int {
	n := 0
	for _, g := range strings.Split(testenv.Stacks(), "\n\n") {
		head, frames, _ := strings.Cut(g, "\n")
		if strings.Contains(head, " [select") && strings.HasPrefix(frames, "github.com/partner-intake/partner-intake/intake/affinity.(*Peers).view(") {
			n++
		}
	}
	return n
}

// w2s is the first of ids that rendezvous gives w2, not this replica
// (w1), while both serve them.
func w2s(ids []string) string {
	for _, id := range ids {
		if rendezvous.Owner(id, []string{"w1", "w2"}) == "w2" {
			return id
		}
	}
	panic("no partner of w2")
}

// waitUnanswered waits until cond holds (never says what did not
// happen), failing if the question asked on answer answers meanwhile
// (how: what it must not answer from).
func waitUnanswered(t *testing.T, answer <-chan bool, how string, cond func() bool, never string) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, func() bool {
		select {
		case got := <-answer:
			t.Fatalf("the question answered %v %s", got, how)
		default:
		}
		return cond()
	}, testenv.Says(never))
}

// holdID takes worker id w's lock for the test and returns the backend
// holding it, as a replica of w registers under.
func holdID(t *testing.T, pool *pgxpool.Pool, w string) uint32 {
	t.Helper()
	lk, err := ledger.TryWorkerLock(context.Background(), pool.Config().ConnConfig, w, time.Minute, ledger.WorkerLockHooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lk.Release)
	return lk.HolderPID()
}
