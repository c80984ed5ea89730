package testenv

import (
	"fmt"
	"testing"
	"time"
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
