package lifecycle_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/lifecycle"
)

// ticker is the smallest Service: one goroutine that runs until its own
// context ends.
type ticker struct {
	lifecycle.Base
	exited atomic.Bool
}

func (t *ticker) Start(ctx context.Context) error {
	ctx, err := t.Begin(ctx)
	if err != nil {
		return err
	}
	t.Go(func() {
		<-ctx.Done()
		t.exited.Store(true)
	})
	return nil
}

var _ lifecycle.Service = (*ticker)(nil)

func TestStopCancelsItsOwnContextAndWaits(t *testing.T) {
	var s ticker
	// the caller's context is never cancelled: Stop alone must end the goroutine
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if !s.exited.Load() {
		t.Fatal("Stop returned before the service's goroutine exited")
	}
}

func TestDoubleStopAndStopBeforeStartAreHarmless(t *testing.T) {
	var s ticker
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop()
	if err := s.Start(context.Background()); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("start after stop: %v, want ErrStarted", err)
	}

	var never ticker
	never.Stop()
	never.Stop()
	if err := never.Start(context.Background()); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("start after a stop before start: %v, want ErrStarted", err)
	}
}

func TestSecondStartIsRefused(t *testing.T) {
	var s ticker
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.Start(context.Background()); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("second start: %v, want ErrStarted", err)
	}
}

func TestHaltReportsWhetherToDrain(t *testing.T) {
	var b lifecycle.Base
	if b.Halt() {
		t.Fatal("Halt before Begin says running")
	}
	var r lifecycle.Base
	if _, err := r.Begin(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !r.Running() {
		t.Fatal("Running false after Begin")
	}
	if !r.Halt() {
		t.Fatal("first Halt of a running service says not running")
	}
	if r.Halt() || r.Running() {
		t.Fatal("second Halt says running")
	}
	r.Cancel()
}

func TestAbortStopsAHalfStartedService(t *testing.T) {
	var b lifecycle.Base
	ctx, err := b.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.Go(func() { <-ctx.Done() })
	boom := errors.New("boom")
	if err := b.Abort(boom); err != boom {
		t.Fatalf("Abort returned %v", err)
	}
	if ctx.Err() == nil {
		t.Fatal("Abort left the context running")
	}
	b.Stop() // harmless after Abort
}

func TestParentCancelEndsTheServiceToo(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	var s ticker
	if err := s.Start(parent); err != nil {
		t.Fatal(err)
	}
	cancel()
	s.Stop()
	if !s.exited.Load() {
		t.Fatal("goroutine still running")
	}
}

// RunEvery calls fn at once, then on every tick, and returns when its
// context ends.
func TestRunEveryCallsAtOnceThenOnEachTickUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	lifecycle.RunEvery(ctx, time.Millisecond, func() {
		if calls++; calls == 3 {
			cancel()
		}
	})
	if calls != 3 {
		t.Fatalf("%d calls, want 3 (the first at once, the third cancelling)", calls)
	}
}
