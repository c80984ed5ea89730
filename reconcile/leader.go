package reconcile

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The leader lock: one reconciler acts at a time across replicas, the one
// whose session holds a PostgreSQL advisory lock for its run.
//
// The lock lives on a connection of its own, kept between runs, never on
// one of the work pool. A run holds its lock from its first partner to its
// last, across every SFTP request of theirs, and needs the work pool
// meanwhile for its statements (a takeover's, a finding's) and the claim
// pool for the partners' claim sections. On a connection of the work
// pool the lock would take one of them out for the whole run; with
// database.max_conns at 2, a takeover in a claim section would then wait
// for a third connection that never comes, and every poll of the daemon
// behind it, until reconcile.partner_timeout.
type leaderLock struct {
	cfg *pgx.ConnConfig // the work pool's: same role, runtime parameters and search_path
	// mu is held for a run: a second RunOnce of the same reconciler while
	// one runs is not the leader (as one of another replica would not be)
	mu   sync.Mutex
	conn *pgx.Conn // nil until the first run, and after a failure
}

// acquire takes the leader lock for a run; release must be called when it
// returns nil. ErrNotLeader: another run holds it. A connection kept from
// an earlier run that fails (the server ended the session meanwhile) is
// replaced once.
func (l *leaderLock) acquire(ctx context.Context) error {
	if !l.mu.TryLock() {
		return ErrNotLeader
	}
	for fresh := l.conn == nil; ; fresh = true {
		if l.conn == nil {
			c, err := pgx.ConnectConfig(ctx, l.cfg)
			if err != nil {
				l.mu.Unlock()
				return fmt.Errorf("reconcile: lock: %w", err)
			}
			l.conn = c
		}
		var got bool
		err := l.conn.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($1::text, 0::int8))`, lockKey).Scan(&got)
		switch {
		case err == nil && got:
			return nil
		case err == nil:
			l.mu.Unlock()
			return ErrNotLeader
		}
		l.drop()
		if fresh || ctx.Err() != nil {
			l.mu.Unlock()
			return fmt.Errorf("reconcile: lock: %w", err)
		}
	}
}

// release gives the lock up after a run, even when the run's context is
// done (a fresh, bounded context); a connection that cannot unlock is
// closed, which drops the lock.
func (l *leaderLock) release(ctx context.Context) {
	defer l.mu.Unlock()
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(uctx, `SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1::text, 0::int8))`, lockKey); err != nil {
		l.drop()
	}
}

// drop closes the connection (its session's locks go with it).
func (l *leaderLock) drop() {
	if l.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
	l.conn = nil
}

// close ends the connection kept between runs, after the run in progress
// (if any).
func (l *leaderLock) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop()
}
