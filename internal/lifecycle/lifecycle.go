// Package lifecycle is how every long-running part of intake starts and
// stops: the daemon, the reconciler, the HTTP server and the purger are each
// a Service, and cmd/intake starts them in order and stops them in reverse.
//
// A service embeds a Base. Start calls Begin, which hands it a context of
// its own (derived from the caller's, cancelled by Stop) and starts its
// goroutines with Go; Stop calls Base.Stop, or, when it has work to drain
// first (the daemon lets files in flight finish), Halt, its own drain, then
// Cancel. Stop before Start and a second Stop are harmless, and a service
// once stopped does not start again.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Service is a long-running part: Start returns once it runs (its work
// goes on in goroutines of its own); Stop returns once every one of them
// has exited.
type Service interface {
	Start(ctx context.Context) error
	Stop()
}

// ErrStarted is Begin's answer to a second start, or a start after Stop.
var ErrStarted = errors.New("already started or stopped")

type state int

const (
	idle state = iota
	running
	stopped
)

// Base is the start/stop bookkeeping a Service embeds: its state, its own
// context and a WaitGroup of its goroutines. The zero value is ready.
type Base struct {
	mu     sync.Mutex
	state  state
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Begin marks the service running and returns its own context: derived
// from parent, cancelled by Cancel (and so by Stop). A second Begin, or one
// after Halt, returns ErrStarted.
func (b *Base) Begin(parent context.Context) (context.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != idle {
		return nil, ErrStarted
	}
	b.state = running
	ctx, cancel := context.WithCancel(parent)
	b.cancel = cancel
	return ctx, nil
}

// Running reports whether the service has begun and not halted. A caller
// that holds off Stop (a lock Stop takes before Halt) may then still Go.
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == running
}

// Go runs f on a goroutine that Stop (Wait) waits for.
func (b *Base) Go(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// Halt marks the service stopped and reports whether it was running: a
// Stop with work to drain drains only then. Harmless before Begin (the
// service will then not start) and more than once (false after the first).
func (b *Base) Halt() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.state == running
	b.state = stopped
	return was
}

// Cancel cancels the service's own context and waits for its goroutines.
func (b *Base) Cancel() {
	b.mu.Lock()
	cancel := b.cancel
	b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	b.wg.Wait()
}

// Stop is the whole stop of a service with nothing to drain: Halt, then
// Cancel. Safe before Begin and more than once.
func (b *Base) Stop() {
	if b.Halt() {
		b.Cancel()
	}
}

// Abort undoes a Start that failed after Begin: it stops the service as
// Stop does and returns err, so Start can `return b.Abort(err)`.
func (b *Base) Abort(err error) error {
	b.Halt()
	b.Cancel()
	return err
}

// RunEvery calls fn at once and then every interval until ctx ends: the
// loop of a service that works in passes (Go(func() { RunEvery(…) })).
func RunEvery(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn()
		if ctx.Err() != nil { // ended during the pass: no pass after it
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
