package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// This file holds the daemon's hold on its worker id: one live process per
// worker id (ledger/workerlock.go says why and how). A poll runs under one
// hold and takes no file as the id's once it ended (stillHeld); a fence
// passes only under the hold its run began in; the id's registration is
// refreshed only while it is held, and made again, before any poll, when
// it is taken again.

// HoldWorkerID takes this process's worker id, or returns a
// *ledger.WorkerIDInUseError naming the process that holds it (or
// errWorkerIDNotHeld: taken once, lost, not yet taken again), on a
// connection of its own. Start and PollOnce take it when it was not taken;
// `intake run --once` takes it on its pool instead (HoldWorkerIDOnPool).
func (d *Daemon) HoldWorkerID(ctx context.Context) error {
	return d.holdWorkerID(ctx, nil)
}

// holdWorkerID is HoldWorkerID; with inUse, it waits while another process
// holds the id (inUse is told who, once).
func (d *Daemon) holdWorkerID(ctx context.Context, inUse func(*ledger.WorkerIDInUseError)) error {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if w := d.id.Load(); w != nil {
		if !w.Held() {
			return errWorkerIDNotHeld
		}
		return nil
	}
	hooks := ledger.WorkerLockHooks{Changed: d.workerIDChanged, Regained: d.workerIDRegained}
	var (
		w   *ledger.WorkerLock
		err error
	)
	if inUse == nil {
		w, err = ledger.TryWorkerLock(ctx, d.db.Config().ConnConfig, d.cfg.WorkerID, d.cfg.Lease, hooks)
	} else {
		w, err = ledger.WaitWorkerLock(ctx, d.db.Config().ConnConfig, d.cfg.WorkerID, d.cfg.Lease, hooks, inUse)
	}
	if err != nil {
		return err
	}
	d.id.Store(w)
	d.metrics.workerIDHeld.Set(1)
	return nil
}

// HoldWorkerIDOnPool takes this process's worker id on a connection of
// the daemon's pool (`intake run --once`: no second backend beside its
// logins; ledger.TakeWorkerLockOnPool), or returns a
// *ledger.WorkerIDInUseError naming the process that holds it.
func (d *Daemon) HoldWorkerIDOnPool(ctx context.Context) error {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if d.id.Load() != nil {
		return errors.New("the worker id is held already")
	}
	w, err := ledger.TakeWorkerLockOnPool(ctx, d.db, d.cfg.WorkerID, d.cfg.Lease, ledger.WorkerLockHooks{Changed: d.workerIDChanged})
	if err != nil {
		return err
	}
	d.id.Store(w)
	d.metrics.workerIDHeld.Set(1)
	return nil
}

// hold is the worker id's hold now, or nil.
func (d *Daemon) hold() *ledger.Hold { return d.id.Load().Current() }

// holdsWorkerID reports whether this process holds its worker id now.
func (d *Daemon) holdsWorkerID() bool { return d.hold() != nil }

// errWorkerIDNotHeld: the process lost its worker id (its lock's session
// ended) and has not taken it again.
var errWorkerIDNotHeld = errors.New("this process does not hold its worker id now (its lock's database session ended)")

// holdKey carries the hold a poll began under in its context.
type holdKey struct{}

// withHold is ctx carrying the hold h a poll runs under.
func withHold(ctx context.Context, h *ledger.Hold) context.Context {
	return context.WithValue(ctx, holdKey{}, h)
}

// stillHeld is errWorkerIDNotHeld when the hold the poll of ctx began
// under has ended: checked before each step that takes a file as this
// worker's (a claim, a resume, an adoption), so a process that lost its id
// starts nothing another process of the id may be doing. What is under way
// goes on: its rows are fenced by their tokens, its publishing by fence.
func (d *Daemon) stillHeld(ctx context.Context) error {
	h, ok := ctx.Value(holdKey{}).(*ledger.Hold)
	if !ok {
		return nil
	}
	w := d.id.Load()
	if !w.HeldIn(h) {
		return errWorkerIDNotHeld
	}
	// a pooled hold (a one-shot run's) is asked of the database, and
	// taken again if its connection's session ended
	if err := w.CheckPooled(ctx); err != nil {
		return fmt.Errorf("%w: %w", errWorkerIDNotHeld, err)
	}
	return nil
}

// workerIDChanged logs and counts a change of the hold.
func (d *Daemon) workerIDChanged(held bool, err error) {
	if held {
		d.metrics.workerIDHeld.Set(1)
		d.log.Info("worker id held again: polling resumes")
		return
	}
	d.metrics.workerIDHeld.Set(0)
	var inUse *ledger.WorkerIDInUseError
	switch {
	case errors.As(err, &inUse):
		d.log.Error("worker id taken by another process while this one had lost it: not polling until it is free", "reason", "worker_id_in_use", "holder", inUse.Holder)
	case errors.Is(err, context.Canceled):
	default:
		d.log.Warn("worker id lost, or not taken again yet: no fence passes and no poll runs until it is held", "err", err)
	}
}

// workerIDRegained registers a started daemon again when it took its id
// again, before its polls resume: another process of the id may have
// retired the id's row meanwhile, and the other replicas would take this
// one's partners and its claims not yet recorded.
func (d *Daemon) workerIDRegained(ctx context.Context) {
	// Another process of the id may have claimed in this worker's dirs
	// while it was not held, and died between a RENAME and its INSERT:
	// every partner's next poll looks through this worker's processing
	// dir again (as after a hint of the reconciler's).
	for _, p := range d.partnerList() {
		p.takenOver.Store(true)
	}
	if !d.registered.Load() {
		return
	}
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		_, err := d.ledger.RegisterWorker(ctx, d.cfg.WorkerID, d.partnerIDs())
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

// awaitWorkerID waits until the worker id is free and takes it (Start,
// when another live process held it); it reports false when ctx ended
// first.
func (d *Daemon) awaitWorkerID(ctx context.Context) bool {
	d.metrics.workerIDHeld.Set(0)
	told := false
	inUse := func(e *ledger.WorkerIDInUseError) {
		if !told {
			told = true
			d.log.Error("worker id in use by another live process: this daemon polls nothing until it is free", "reason", "worker_id_in_use", "holder", e.Holder)
		}
	}
	for {
		err := d.holdWorkerID(ctx, inUse)
		if err == nil {
			d.log.Info("worker id free: this daemon runs as it")
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !errors.Is(err, errWorkerIDNotHeld) {
			d.log.Warn("worker id lock", "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(5*time.Second, max(time.Second, d.cfg.Lease/3))):
		}
	}
}

// awaitHeld makes sure PollOnce runs holding the worker id: it takes the
// id when it was never taken, and when it was lost (a PostgreSQL restart)
// waits a few seconds for the lock to be taken again.
func (d *Daemon) awaitHeld(ctx context.Context) error {
	w := d.id.Load()
	if w == nil {
		return d.HoldWorkerID(ctx)
	}
	if w.Pooled().PID != 0 {
		return nil // never lost between steps: each step checks it (CheckPooled)
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

// ReleaseWorkerID lets the worker id go (Stop).
func (d *Daemon) ReleaseWorkerID() {
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if w := d.id.Swap(nil); w != nil {
		w.Release()
		d.metrics.workerIDHeld.Set(0)
	}
}
