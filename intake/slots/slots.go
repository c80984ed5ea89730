// Package slots is a poll's pool of a partner's slots: at most n of the
// partner's files or groups run at once in one daemon (its concurrency),
// the files this worker resumes, those the poll claims and the entries it
// moves to quarantine unread alike, so one slow file holds one slot, never
// the poll.
package slots

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Pool holds the slots of one poll. A slot is taken before its work is
// known (a claim is made only while a slot is held) and handed its work,
// or given back unused, by the function Take returns. The first work to
// fail ends Done's context; the rest run on to their end.
type Pool struct {
	g    *errgroup.Group
	done context.Context
}

// New makes a pool of n slots (at least one) under ctx.
func New(ctx context.Context, n int) *Pool {
	g, done := errgroup.WithContext(ctx)
	g.SetLimit(max(n, 1))
	return &Pool{g: g, done: done}
}

// Take waits for a free slot and holds it; the function it returns hands
// the slot its work, or gives it back unused (nil).
func (p *Pool) Take() func(work func() error) {
	start := make(chan func() error, 1)
	p.g.Go(func() error { return runHanded(start) })
	return func(work func() error) { start <- work }
}

// TryTake is Take when a slot is free right now, else nil.
func (p *Pool) TryTake() func(work func() error) {
	start := make(chan func() error, 1)
	if !p.g.TryGo(func() error { return runHanded(start) }) {
		return nil
	}
	return func(work func() error) { start <- work }
}

func runHanded(start <-chan func() error) error {
	if work := <-start; work != nil {
		return work()
	}
	return nil
}

// Run runs work in the next free slot.
func (p *Pool) Run(work func() error) { p.g.Go(work) }

// Failed reports whether a work returned an error (or ctx ended).
func (p *Pool) Failed() bool { return p.done.Err() != nil }

// Wait waits for every slot's work and returns the first error.
func (p *Pool) Wait() error { return p.g.Wait() }
