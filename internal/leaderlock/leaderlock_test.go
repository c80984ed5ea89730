package leaderlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/leaderlock"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func connConfig(t *testing.T, url string) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	migrations.SetSearchPath(cfg)
	return cfg
}

// holder is the backend holding the advisory lock of this test's
// database, 0 when none does.
func holder(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (pid int64) {
	t.Helper()
	err := q.QueryRow(context.Background(), `SELECT coalesce(max(pid), 0) FROM pg_catalog.pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// threeLocks are two processes' locks of one key (a, b) and a lock of
// another key (other), each on a connection of its own, closed at the
// test's end.
func threeLocks(t *testing.T) (pool *pgxpool.Pool, a, b, other *leaderlock.Lock) {
	t.Helper()
	url, pool := testenv.DB(t)
	cfg := connConfig(t, url)
	a, b = leaderlock.New(cfg, "test/run"), leaderlock.New(cfg, "test/run")
	other = leaderlock.New(cfg, "test/other")
	for _, l := range []*leaderlock.Lock{a, b, other} {
		t.Cleanup(l.Close)
	}
	return pool, a, b, other
}

// One run at a time holds a lock: a second run of the same process, or a
// run of another, is told ErrHeld until the first releases; another key
// is another lock.
func TestOneRunAtATimeHoldsTheLock(t *testing.T) {
	ctx := context.Background()
	pool, a, b, other := threeLocks(t)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(ctx); !errors.Is(err, leaderlock.ErrHeld) {
		t.Fatalf("a second run of the same process: got %v, want ErrHeld", err)
	}
	if err := b.Acquire(ctx); !errors.Is(err, leaderlock.ErrHeld) {
		t.Fatalf("a run of another process: got %v, want ErrHeld", err)
	}
	if err := other.Acquire(ctx); err != nil {
		t.Fatalf("another key: %v", err)
	}
	other.Release(ctx)
	first := holder(t, pool)
	a.Release(ctx)
	if err := b.Acquire(ctx); err != nil {
		t.Fatalf("after the first released: %v", err)
	}
	if pid := holder(t, pool); pid == 0 || pid == first {
		t.Fatalf("the lock is held by backend %d, want the second process's (the first's was %d)", pid, first)
	}
	b.Release(ctx)
	if pid := holder(t, pool); pid != 0 {
		t.Fatalf("backend %d holds the lock after its release", pid)
	}
}

// The connection kept between runs is replaced once when the server ended
// its session meanwhile; the run still gets the lock.
func TestAConnectionEndedBetweenRunsIsReplaced(t *testing.T) {
	url, pool := testenv.DB(t)
	ctx := context.Background()
	l := leaderlock.New(connConfig(t, url), "test/run")
	defer l.Close()
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	kept := holder(t, pool)
	l.Release(ctx)
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend($1::int4)`, kept); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1::int4`, kept) == 0
	}, testenv.Says("the terminated backend stayed"))
	if err := l.Acquire(ctx); err != nil {
		t.Fatalf("the run after its connection ended: %v", err)
	}
	if pid := holder(t, pool); pid == 0 || pid == kept {
		t.Fatalf("the lock is held by backend %d, want a new one (the ended was %d)", pid, kept)
	}
	l.Release(ctx)
}

// The lock is held on a connection of its own: a run holding it has every
// connection of the pool its statements use (here the only one).
func TestTheLockTakesNoConnectionOfThePool(t *testing.T) {
	url, _ := testenv.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work := testenv.PoolWith(t, url, func(pc *pgxpool.Config) { pc.MaxConns = 1 })
	l := leaderlock.New(work.Config().ConnConfig, "test/run")
	defer l.Close()
	if err := l.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if pid := holder(t, work); pid == 0 {
		t.Fatal("the lock is not held")
	}
}

// A run's hold fences its writes on other connections: Check passes while
// its session holds the lock, and returns ErrLost once the run released it
// or its session ended (a process paused past the server's timeouts),
// whoever holds the lock now.
func TestAHoldIsLostWithItsSession(t *testing.T) {
	ctx := context.Background()
	pool, a, b, other := threeLocks(t)
	if err := other.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Hold().Check(ctx, pool); err != nil {
		t.Fatalf("the other key's run: %v", err)
	}
	other.Release(ctx)
	if err := other.Hold().Check(ctx, pool); !errors.Is(err, leaderlock.ErrLost) {
		t.Fatalf("a released lock's hold: got %v, want ErrLost", err)
	}
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	hold := a.Hold()
	defer a.Release(ctx) // its run ends (the connection gone, it is dropped)
	if err := hold.Check(ctx, pool); err != nil {
		t.Fatalf("while the run holds the lock: %v", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend($1::int4)`, holder(t, pool)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return holder(t, pool) == 0 }, testenv.Says("the session ended"))
	if err := hold.Check(ctx, pool); !errors.Is(err, leaderlock.ErrLost) {
		t.Fatalf("after its session ended: got %v, want ErrLost", err)
	}
	if err := b.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if err := hold.Check(ctx, pool); !errors.Is(err, leaderlock.ErrLost) {
		t.Fatalf("with another run holding the lock: got %v, want ErrLost", err)
	}
	if err := b.Hold().Check(ctx, pool); err != nil {
		t.Fatalf("the new run's hold: %v", err)
	}
}
