// Package testsignal lets a test wait for an event inside a long-running
// part of the daemon (a poll finished, a lease extended) instead of
// sleeping for a guess of how long the event takes. After River's
// rivershared/testsignal: a part holds a Signal per event and calls Signal
// where the event happens; the zero Signal ignores the call (production
// never initialises one, so a hook costs one atomic load), and a test calls
// Init before the event and then waits.
//
// Unlike River's, a full buffer drops the value instead of failing the
// test from the part's goroutine (which may outlive the test): a part that
// signals on every poll signals a lot. A wait that times out says how many
// were dropped.
package testsignal

import (
	"sync/atomic"
	"time"
)

// Timeout bounds every wait; generous, as the machine may be loaded.
const Timeout = 2 * time.Minute

// bufferSize is how many values a Signal holds until a test takes them.
const bufferSize = 1024

// TB is the part of testing.TB a wait uses (this package is linked into
// the daemon, which must not import testing).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Signal carries the values of one kind of event to a waiting test.
type Signal[T any] struct {
	st atomic.Pointer[state[T]]
}

type state[T any] struct {
	tb      TB
	ch      chan T
	dropped atomic.Int64
}

// Init makes the signal record events; only tests call it.
func (s *Signal[T]) Init(tb TB) {
	s.st.Store(&state[T]{tb: tb, ch: make(chan T, bufferSize)})
}

// Signal records an event; it never blocks and does nothing unless a test
// initialised the signal.
func (s *Signal[T]) Signal(v T) {
	st := s.st.Load()
	if st == nil {
		return
	}
	select {
	case st.ch <- v:
	default:
		st.dropped.Add(1)
	}
}

func (s *Signal[T]) state() *state[T] {
	st := s.st.Load()
	if st == nil {
		panic("testsignal: signal not initialised (Init it before the event)")
	}
	return st
}

// C is the channel of recorded values, for a select over several signals.
func (s *Signal[T]) C() <-chan T { return s.state().ch }

// Clear forgets the values recorded so far: a wait after it sees only
// events signalled after it.
func (s *Signal[T]) Clear() {
	st := s.state()
	for {
		select {
		case <-st.ch:
		default:
			return
		}
	}
}

// WaitOrTimeout returns the next value, failing the test after Timeout.
func (s *Signal[T]) WaitOrTimeout() T {
	s.state().tb.Helper()
	return s.WaitFor(func(T) bool { return true })
}

// WaitFor returns the next value for which ok holds, dropping the values
// before it; it fails the test after Timeout.
func (s *Signal[T]) WaitFor(ok func(T) bool) T {
	st := s.state()
	st.tb.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	for {
		select {
		case v := <-st.ch:
			if ok(v) {
				return v
			}
		case <-deadline.C:
			st.tb.Fatalf("testsignal: no awaited event within %s (%d values dropped on a full buffer)", Timeout, st.dropped.Load())
			var zero T
			return zero
		}
	}
}
