package intake

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/workerid"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/testsignal"
)

// replica is this daemon's row in intake_worker: recorded once the worker
// id is held (register), kept fresh while it is (heartbeat), recorded
// again when the id is taken again (regained); Stop retires it.
type replica struct {
	ledger   *ledger.Ledger
	workerID string
	lease    time.Duration
	id       *workerid.Keeper
	parts    *partnerSet
	log      *slog.Logger
	beat     *testsignal.Signal[struct{}] // the WorkerBeat test signal
	// life and startMu are the daemon's: a registration runs on its
	// goroutines, never beside a Start under way nor after Stop's Halt.
	life    *lifecycle.Base
	startMu *sync.Mutex
	// registered: Start recorded this replica in intake_worker, so partner
	// affinity applies (intake/affinity).
	registered atomic.Bool
	// prevDrained: this worker id's previous run stopped drained, so a
	// partner another replica polls needs no look into processing/ after
	// start unless the database shows live files of this worker there.
	prevDrained bool
}

// registerRow writes this replica's row (RegisterWorker) with partners,
// under the worker id's lock as this process holds it.
func (r *replica) registerRow(ctx context.Context, partners []string) (drained bool, err error) {
	return r.ledger.RegisterWorker(ctx, r.workerID, partners, r.id.Lock().HolderPID())
}

// register records this replica in intake_worker (RegisterWorker) and
// starts its heartbeat; the worker id is held.
func (r *replica) register(ctx context.Context) error {
	drained, err := r.registerRow(ctx, r.parts.order)
	if err != nil {
		return err
	}
	r.prevDrained = drained
	for _, p := range r.parts.byID {
		p.mu.Lock()
		p.settled = drained
		p.mu.Unlock()
	}
	r.registered.Store(true)
	r.id.SetAwaiting(false)
	r.life.Go(func() { r.heartbeat(ctx) })
	return nil
}

// registerWhenHeld registers a replica that took its worker id after
// Start (workerid.Keeper.Await), retrying until the database takes it.
func (r *replica) registerWhenHeld(ctx context.Context) {
	for {
		// not beside a Start still under way (which may be waiting for
		// this goroutine to end: TryLock), nor after Stop's Halt
		for !r.startMu.TryLock() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		if !r.life.Running() {
			r.startMu.Unlock()
			return
		}
		err := r.register(ctx)
		r.startMu.Unlock()
		if err == nil || ctx.Err() != nil {
			return
		}
		r.log.Warn("register worker", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// heartbeat keeps this replica's intake_worker row fresh, so the
// reconcilers of other replicas do not adopt its claims; while the worker
// id is not held (lost, and maybe another process's now) it is left to
// its holder.
func (r *replica) heartbeat(ctx context.Context) {
	everyTick(ctx, r.lease/3, func() bool {
		if !r.id.Held() {
			return true
		}
		_, err := r.registerRow(ctx, r.parts.ids())
		if err != nil && ctx.Err() == nil {
			r.log.Warn("worker heartbeat failed", "err", err)
		}
		if err == nil {
			r.beat.Signal(struct{}{})
		}
		return true
	})
}

// regained is what a started daemon does when it took its id again,
// before its polls resume (workerid.Config.Regained): it registers again,
// since another process of the id may have retired the id's row
// meanwhile, and the other replicas would take this one's partners and
// its claims not yet recorded.
func (r *replica) regained(ctx context.Context) {
	// Another process of the id may have claimed in this worker's dirs
	// while it was not held, and died between a RENAME and its INSERT:
	// every partner's next poll looks through this worker's processing
	// dir again (as after a hint of the reconciler's).
	for _, p := range r.parts.list() {
		p.takenOver.Store(true)
	}
	if !r.registered.Load() {
		return
	}
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		_, err := r.registerRow(ctx, r.parts.ids())
		if err == nil {
			return
		}
		r.log.Warn("register worker after taking the worker id again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
