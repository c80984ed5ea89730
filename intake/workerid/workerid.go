// Package workerid is the daemon's hold on its worker id: one live
// process per worker id (intake/ledger/workerlock.go says why and how). A
// poll runs under one hold and takes no file as the id's once it ended
// (StillHeld); a fence passes only under the hold its run began in; the
// id's registration is refreshed only while it is held, and made again,
// before any poll, when it is taken again (Config.Regained).
package workerid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// ErrNotHeld: the process lost its worker id (its lock's session ended)
// and has not taken it again.
var ErrNotHeld = errors.New("this process does not hold its worker id now (its lock's database session ended)")

// Config is what a Keeper needs.
type Config struct {
	DB       *pgxpool.Pool // the daemon's pool: its connection settings, and a one-shot run's hold
	WorkerID string
	Lease    time.Duration
	Log      *slog.Logger
	Held     prometheus.Gauge // intake_worker_id_held
	// Regained runs when a hold lost is taken again, before polls resume.
	Regained func(ctx context.Context)
}

// Keeper holds the worker id of one process.
type Keeper struct {
	cfg Config
	// mu orders the id's taking and letting go.
	mu sync.Mutex
	id atomic.Pointer[ledger.WorkerLock]
	// awaiting: Start found the id held by another live process and
	// waits for it.
	awaiting atomic.Bool
}

// New is a Keeper that holds nothing yet.
func New(cfg Config) *Keeper { return &Keeper{cfg: cfg} }

// Hold takes this process's worker id, or returns a
// *ledger.WorkerIDInUseError naming the process that holds it (or
// ErrNotHeld: taken once, lost, not yet taken again), on a connection of
// its own. The daemon's Start and PollOnce take it when it was not taken;
// `intake run --once` takes it on its pool instead (HoldOnPool).
func (k *Keeper) Hold(ctx context.Context) error { return k.hold(ctx, nil) }

// hold is Hold; with inUse, it waits while another process holds the id
// (inUse is told who, once).
func (k *Keeper) hold(ctx context.Context, inUse func(*ledger.WorkerIDInUseError)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w := k.id.Load(); w != nil {
		if !w.Held() {
			return ErrNotHeld
		}
		return nil
	}
	hooks := ledger.WorkerLockHooks{Changed: k.changed, Regained: k.regained}
	var (
		w   *ledger.WorkerLock
		err error
	)
	cc := k.cfg.DB.Config().ConnConfig
	if inUse == nil {
		w, err = ledger.TryWorkerLock(ctx, cc, k.cfg.WorkerID, k.cfg.Lease, hooks)
	} else {
		w, err = ledger.WaitWorkerLock(ctx, cc, k.cfg.WorkerID, k.cfg.Lease, hooks, inUse)
	}
	if err != nil {
		return err
	}
	k.id.Store(w)
	k.cfg.Held.Set(1)
	return nil
}

func (k *Keeper) regained(ctx context.Context) {
	if k.cfg.Regained != nil {
		k.cfg.Regained(ctx)
	}
}

// HoldOnPool takes this process's worker id on a connection of the
// daemon's pool (`intake run --once`: no second backend beside its
// logins; ledger.TakeWorkerLockOnPool), or returns a
// *ledger.WorkerIDInUseError naming the process that holds it.
func (k *Keeper) HoldOnPool(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.id.Load() != nil {
		return errors.New("the worker id is held already")
	}
	w, err := ledger.TakeWorkerLockOnPool(ctx, k.cfg.DB, k.cfg.WorkerID, k.cfg.Lease, ledger.WorkerLockHooks{Changed: k.changed})
	if err != nil {
		return err
	}
	k.id.Store(w)
	k.cfg.Held.Set(1)
	return nil
}

// Lock is the worker id's lock, or nil before it was taken.
func (k *Keeper) Lock() *ledger.WorkerLock { return k.id.Load() }

// Current is the worker id's hold now, or nil.
func (k *Keeper) Current() *ledger.Hold { return k.id.Load().Current() }

// Held reports whether this process holds its worker id now.
func (k *Keeper) Held() bool { return k.Current() != nil }

// SetAwaiting notes whether Start waits for another live process to let
// the id go (a poll meanwhile runs nothing).
func (k *Keeper) SetAwaiting(v bool) { k.awaiting.Store(v) }

// Awaiting reports whether Start waits for the id (SetAwaiting).
func (k *Keeper) Awaiting() bool { return k.awaiting.Load() }

// holdKey carries the hold a poll began under in its context.
type holdKey struct{}

// WithHold is ctx carrying the hold h a poll runs under.
func WithHold(ctx context.Context, h *ledger.Hold) context.Context {
	return context.WithValue(ctx, holdKey{}, h)
}

// StillHeld is ErrNotHeld when the hold the poll of ctx began under has
// ended: checked before each step that takes a file as this worker's (a
// claim, a resume, an adoption), so a process that lost its id starts
// nothing another process of the id may be doing. What is under way goes
// on: its rows are fenced by their tokens, its publishing by fence.
func (k *Keeper) StillHeld(ctx context.Context) error {
	h, ok := ctx.Value(holdKey{}).(*ledger.Hold)
	if !ok {
		return nil
	}
	w := k.id.Load()
	if !w.HeldIn(h) {
		return ErrNotHeld
	}
	// a pooled hold (a one-shot run's) is asked of the database, and
	// taken again if its connection's session ended
	if err := w.CheckPooled(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return nil
}

// changed logs and counts a change of the hold.
func (k *Keeper) changed(held bool, err error) {
	if held {
		k.cfg.Held.Set(1)
		k.cfg.Log.Info("worker id held again: polling resumes")
		return
	}
	k.cfg.Held.Set(0)
	var inUse *ledger.WorkerIDInUseError
	switch {
	case errors.As(err, &inUse):
		k.cfg.Log.Error("worker id taken by another process while this one had lost it: not polling until it is free", "reason", "worker_id_in_use", "holder", inUse.Holder)
	case errors.Is(err, context.Canceled):
	default:
		k.cfg.Log.Warn("worker id lost, or not taken again yet: no fence passes and no poll runs until it is held", "err", err)
	}
}

// Await waits until the worker id is free and takes it (Start, when
// another live process held it); it reports false when ctx ended first.
func (k *Keeper) Await(ctx context.Context) bool {
	k.cfg.Held.Set(0)
	told := false
	inUse := func(e *ledger.WorkerIDInUseError) {
		if !told {
			told = true
			k.cfg.Log.Error("worker id in use by another live process: this daemon polls nothing until it is free", "reason", "worker_id_in_use", "holder", e.Holder)
		}
	}
	for {
		err := k.hold(ctx, inUse)
		if err == nil {
			k.cfg.Log.Info("worker id free: this daemon runs as it")
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if !errors.Is(err, ErrNotHeld) {
			k.cfg.Log.Warn("worker id lock", "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(5*time.Second, max(time.Second, k.cfg.Lease/3))):
		}
	}
}

// AwaitHeld makes sure a one-off poll (PollOnce) runs holding the worker
// id: it takes the id when it was never taken, and when it was lost (a
// PostgreSQL restart) waits a few seconds for the lock to be taken again.
func (k *Keeper) AwaitHeld(ctx context.Context) error {
	w := k.id.Load()
	if w == nil {
		return k.Hold(ctx)
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
	return nil // not held still: the poll says so (ErrNotHeld)
}

// Release lets the worker id go (Stop).
func (k *Keeper) Release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if w := k.id.Swap(nil); w != nil {
		w.Release()
		k.cfg.Held.Set(0)
	}
}
