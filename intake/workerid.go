package intake

import (
	"context"
	"errors"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// This file holds the daemon's hold on its worker id: one live process per
// worker id (ledger/workerlock.go says why). A poll runs, a fence passes
// and the id's registration is refreshed only while the hold stands.

// HoldWorkerID takes this process's worker id, or returns a
// *ledger.WorkerIDInUseError naming the process that holds it. PollOnce
// takes it when it was not taken; `intake run --once` takes it beside its
// logins, so that its error is the run's.
func (d *Daemon) HoldWorkerID(ctx context.Context) error {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if d.id.Load() != nil {
		return nil
	}
	w, err := ledger.TryWorkerLock(ctx, d.db.Config().ConnConfig, d.cfg.WorkerID, d.cfg.Lease, d.workerIDChanged)
	if err != nil {
		return err
	}
	d.id.Store(w)
	d.metrics.workerIDHeld.Set(1)
	return nil
}

// awaitHeld makes sure PollOnce runs holding the worker id: it takes the
// id when it was never taken, and when it was lost (a PostgreSQL restart)
// waits a few seconds for the lock to be taken again.
func (d *Daemon) awaitHeld(ctx context.Context) error {
	w := d.id.Load()
	if w == nil {
		return d.HoldWorkerID(ctx)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !w.Held() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil // not held still: the poll says so (errWorkerIDNotHeld)
}

// holdsWorkerID reports whether this process holds its worker id now.
func (d *Daemon) holdsWorkerID() bool { return d.id.Load().Held() }

// errWorkerIDNotHeld: the process lost its worker id (its lock's session
// ended) and has not taken it again.
var errWorkerIDNotHeld = errors.New("this process does not hold its worker id now (its lock's database session ended)")

// workerIDChanged logs and counts a change of the hold.
func (d *Daemon) workerIDChanged(held bool, err error) {
	if held {
		d.metrics.workerIDHeld.Set(1)
		d.log.Info("worker id held again: polling resumes")
		return
	}
	d.metrics.workerIDHeld.Set(0)
	var inUse *ledger.WorkerIDInUseError
	if errors.As(err, &inUse) {
		d.log.Error("worker id taken by another process while this one had lost it: not polling", "reason", "worker_id_in_use", "holder", inUse.Holder)
		return
	}
	d.log.Warn("worker id lost (its lock's database session ended): no fence passes and no poll runs until it is held again", "err", err)
}

// awaitWorkerID waits until the worker id is free and takes it (Start,
// when another live process held it), every few seconds; the error is
// logged once. It reports false when ctx ended first.
func (d *Daemon) awaitWorkerID(ctx context.Context, first error) bool {
	var inUse *ledger.WorkerIDInUseError
	if errors.As(first, &inUse) {
		d.log.Error("worker id in use by another live process: this daemon polls nothing until it is free", "reason", "worker_id_in_use", "holder", inUse.Holder)
	}
	d.metrics.workerIDHeld.Set(0)
	retry := min(5*time.Second, max(time.Second, d.cfg.Lease/3))
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(retry):
		}
		err := d.HoldWorkerID(ctx)
		if err == nil {
			d.log.Info("worker id free: this daemon runs as it")
			return true
		}
		if !errors.As(err, &inUse) && ctx.Err() == nil {
			d.log.Warn("worker id lock", "err", err)
		}
	}
}

// releaseWorkerID lets the worker id go (Stop).
func (d *Daemon) releaseWorkerID() {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if w := d.id.Swap(nil); w != nil {
		w.Release()
		d.metrics.workerIDHeld.Set(0)
	}
}
