package intake

import (
	"context"
	"time"

	"github.com/partner-intake/partner-intake/intake/workerid"
)

// The daemon's hold on its worker id is intake/workerid's Keeper
// (Daemon.workerID): one live process per worker id. This file is what
// the daemon does when the id is taken again, and its exported handles.

// errWorkerIDNotHeld: the process lost its worker id (its lock's session
// ended) and has not taken it again.
var errWorkerIDNotHeld = workerid.ErrNotHeld

// HoldWorkerID takes this process's worker id, or returns a
// *ledger.WorkerIDInUseError naming the process that holds it (or
// errWorkerIDNotHeld: taken once, lost, not yet taken again), on a
// connection of its own. Start and PollOnce take it when it was not taken;
// `intake run --once` takes it on its pool instead (HoldWorkerIDOnPool).
func (d *Daemon) HoldWorkerID(ctx context.Context) error { return d.workerID.Hold(ctx) }

// HoldWorkerIDOnPool takes this process's worker id on a connection of
// the daemon's pool (`intake run --once`), or returns a
// *ledger.WorkerIDInUseError naming the process that holds it.
func (d *Daemon) HoldWorkerIDOnPool(ctx context.Context) error { return d.workerID.HoldOnPool(ctx) }

// ReleaseWorkerID lets the worker id go (Stop).
func (d *Daemon) ReleaseWorkerID() { d.workerID.Release() }

// workerIDRegained is what a started daemon does when it took its id
// again, before its polls resume: it registers again, since another
// process of the id may have retired the id's row meanwhile, and the
// other replicas would take this one's partners and its claims not yet
// recorded.
func workerIDRegained(d *Daemon) func(ctx context.Context) {
	return func(ctx context.Context) {
		// Another process of the id may have claimed in this worker's dirs
		// while it was not held, and died between a RENAME and its INSERT:
		// every partner's next poll looks through this worker's processing
		// dir again (as after a hint of the reconciler's).
		for _, p := range d.parts.list() {
			p.takenOver.Store(true)
		}
		if !d.registered.Load() {
			return
		}
		for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
			_, err := d.ledger.RegisterWorker(ctx, d.cfg.WorkerID, d.parts.ids())
			if err == nil {
				return
			}
			d.log.Warn("register worker after taking the worker id again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}
