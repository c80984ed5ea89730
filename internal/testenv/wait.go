package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WaitFor checks cond every 10 ms until it holds, and fails t once limit
// has passed without it: the one way a test waits for state it cannot be
// signalled about (a row's state, a process's output, a server's
// connections). why, if given, says what was awaited, called once on
// failure (so it may read output collected meanwhile).
func WaitFor(t testing.TB, limit time.Duration, cond func() bool, why ...func() string) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			msg := fmt.Sprintf("condition not met within %s", limit)
			for _, w := range why {
				msg += ": " + w()
			}
			t.Fatal(msg)
		case <-tick.C:
		}
	}
}

// Says is a WaitFor why that says what.
func Says(what string) func() string { return func() string { return what } }

// WaitStable waits until the database's clock says the partner's file
// name in ready/ has been seen unchanged for at least d (readiness
// stable), so a poll's verdict does not depend on how fast this machine
// is.
func WaitStable(t testing.TB, pool *pgxpool.Pool, partner, name string, d time.Duration) {
	t.Helper()
	WaitFor(t, 30*time.Second, func() bool {
		var ok bool
		err := pool.QueryRow(context.Background(), `SELECT pg_catalog.clock_timestamp() - first_seen_unchanged >= $3::interval
			FROM intake_ready_seen WHERE partner_id = $1 AND name = $2`, partner, name, d.String()).Scan(&ok)
		if err != nil {
			t.Fatalf("stability record of %s: %v", name, err)
		}
		return ok
	}, Says(name+" never became stable"))
}

// ClosePoolAtCleanup closes pool when t ends, and fails t if a connection
// is still acquired a minute later: one the code under test never gave
// back, for which pgxpool's Close would wait for good (the test binary
// then goes on, and its leak check names the goroutine).
func ClosePoolAtCleanup(t testing.TB, pool *pgxpool.Pool) {
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			pool.Close()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Errorf("%d connections of the pool still acquired a minute after the test ended: never released", pool.Stat().AcquiredConns())
		}
	})
}
