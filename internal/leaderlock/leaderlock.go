// Package leaderlock is a run that one process at a time makes across
// replicas (the reconciler's, the purge's): the process whose session
// holds a PostgreSQL advisory lock for the run.
//
// The lock lives on a connection of its own, kept between runs, never on
// one of the work pool. A run holds its lock from its start to its end,
// across every SFTP request it makes, and needs the work pool meanwhile
// for its statements (and the claim pool for partners' claim sections).
// On a connection of the work pool the lock would take one of them out
// for the whole run; with database.max_conns at 2, a statement that needs
// a second connection while another is held (a takeover inside a claim
// section) would wait for one that never comes, and every poll of the
// daemon behind it.
package leaderlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrHeld: another run holds the lock, in this process or another.
var ErrHeld = errors.New("the lock is held by another run")

// ErrLost: the run's session no longer holds the lock (it ended: the
// process paused past the server's timeouts, its connection cut); another
// run may hold it now.
var ErrLost = errors.New("the run no longer holds its lock")

// Hold is a run's hold of the lock: its session (the backend's pid) and
// the lock's key. A write of the run on another connection is fenced by it
// (Check in the write's transaction).
type Hold struct {
	pid uint32
	key string
}

// Hold is the hold of the run in progress (Acquire returned nil).
func (l *Lock) Hold() Hold { return Hold{pid: l.conn.PgConn().PID(), key: l.key} }

// Check returns ErrLost unless the run's session still holds the lock, as
// q (a transaction of the write it fences) sees it. A session that ends
// after the check cannot be followed by another run's write before this
// transaction commits: the next run takes the lock, then runs its whole
// matrix before it writes.
func (h Hold) Check(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var held bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
		WHERE locktype = 'advisory' AND granted AND pid = $1::int4 AND objsubid = 1
		  AND ((classid::int8 << 32) | objid::int8) = pg_catalog.hashtextextended($2::text, 0::int8))`, int32(h.pid), h.key).Scan(&held)
	if err != nil {
		return fmt.Errorf("lock %s: %w", h.key, err)
	}
	if !held {
		return fmt.Errorf("lock %s: %w", h.key, ErrLost)
	}
	return nil
}

// Lock is one named advisory lock.
type Lock struct {
	key string
	cfg *pgx.ConnConfig // the work pool's: same role, runtime parameters and search_path
	// mu is held for a run: a second run of the same process while one
	// runs does not get the lock (as one of another replica would not)
	mu   sync.Mutex
	conn *pgx.Conn // nil until the first run, and after a failure
}

// New is the lock named key, taken on connections made from cfg.
func New(cfg *pgx.ConnConfig, key string) *Lock {
	return &Lock{key: key, cfg: cfg}
}

// Acquire takes the lock for a run; Release must be called when it
// returns nil. ErrHeld: another run holds it. A connection kept from an
// earlier run that fails (the server ended the session meanwhile) is
// replaced once.
func (l *Lock) Acquire(ctx context.Context) error {
	if !l.mu.TryLock() {
		return ErrHeld
	}
	for fresh := l.conn == nil; ; fresh = true {
		if l.conn == nil {
			c, err := pgx.ConnectConfig(ctx, l.cfg)
			if err != nil {
				l.mu.Unlock()
				return fmt.Errorf("lock %s: %w", l.key, err)
			}
			l.conn = c
		}
		var got bool
		err := l.conn.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($1::text, 0::int8))`, l.key).Scan(&got)
		switch {
		case err == nil && got:
			return nil
		case err == nil:
			l.mu.Unlock()
			return ErrHeld
		}
		l.drop()
		if fresh || ctx.Err() != nil {
			l.mu.Unlock()
			return fmt.Errorf("lock %s: %w", l.key, err)
		}
	}
}

// Release gives the lock up after a run, even when the run's context is
// done (a fresh, bounded context); a connection that cannot unlock is
// closed, which drops the lock.
func (l *Lock) Release(ctx context.Context) {
	defer l.mu.Unlock()
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(uctx, `SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1::text, 0::int8))`, l.key); err != nil {
		l.drop()
	}
}

// drop closes the connection (its session's locks go with it).
func (l *Lock) drop() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
	l.conn = nil
}

// Close ends the connection kept between runs, after the run in progress
// (if any).
func (l *Lock) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop()
}
