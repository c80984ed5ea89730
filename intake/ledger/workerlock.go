package ledger

// One live process per worker id.
//
// A worker id names processing/<worker>/ on every partner's site, its
// spool's temporary files and the rows it claimed, and a restarted process
// of the id resumes those rows at once (Resume), without waiting for their
// leases, because its predecessor is gone. That holds only while one
// process at a time runs as the id. Two at once (a second daemon with the
// same config, `intake run --once` beside the daemon of its host, whose
// worker_id defaults to the hostname, a cron's one-shot runs overlapping)
// took each other's rows in the middle of a file, deleted each other's
// downloads as a crash's leftovers, and one whose group fence still stood
// published a group's receipts after the other had taken its rows over.
//
// So a process runs as its worker id only while it holds the id's
// session-level advisory lock, on a connection of its own (WorkerLock).
// The lock ends with that session: a process that exits or is killed
// releases it at once (its socket closes); one whose host is gone or
// frozen releases it when PostgreSQL's keepalives give up on it, set on
// this connection to take at least a lease, so its files' leases have run
// out by then as for any takeover. A holder whose session ends under it (a
// PostgreSQL restart, the connection cut) stops running as the id at once
// (Held is false: its fences fail, its polls do nothing) and takes the
// lock again as soon as it can.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// workerLockKey is the advisory lock key of a worker id.
const workerLockKey = `hashtextextended('partner-intake/worker/' || $1, 0)`

// WorkerIDInUseError: another live session holds the worker id's lock.
type WorkerIDInUseError struct {
	Worker string
	Holder string // who holds it, as far as the database tells
}

func (e *WorkerIDInUseError) Error() string {
	return fmt.Sprintf("worker id %s is in use by another live process (%s): two processes must not run as one worker id; give each its own worker_id (reason worker_id_in_use)", e.Worker, e.Holder)
}

// WorkerLock is a process's hold on its worker id.
type WorkerLock struct {
	worker  string
	cc      *pgx.ConnConfig
	changed func(held bool, err error)

	held   atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
}

// workerLockConnConfig is the lock connection's config: the pool's, with
// keepalives that give up on a silent client after at least a lease.
func workerLockConnConfig(cc *pgx.ConnConfig, worker string, lease time.Duration) *pgx.ConnConfig {
	c := cc.Copy()
	c.RuntimeParams["application_name"] = AppName(worker)
	interval := max(1, int((lease+3*time.Second-1)/(3*time.Second)))
	c.RuntimeParams["tcp_keepalives_idle"] = "30"
	c.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(interval)
	c.RuntimeParams["tcp_keepalives_count"] = "3"
	delete(c.RuntimeParams, "idle_in_transaction_session_timeout")
	return c
}

// TryWorkerLock takes the worker id's lock for this process on a
// connection of its own (cc: the pool's config) or returns a
// *WorkerIDInUseError naming the holder. While it is held a goroutine
// watches the connection; if the session ends, Held turns false, changed
// is called with false and the error, and the lock is taken again every
// few seconds until it is, changed then called with true. Release lets
// it go.
func TryWorkerLock(ctx context.Context, cc *pgx.ConnConfig, worker string, lease time.Duration, changed func(held bool, err error)) (*WorkerLock, error) {
	cfg := workerLockConnConfig(cc, worker, lease)
	conn, err := takeWorkerLock(ctx, cfg, worker)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		changed = func(bool, error) {}
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &WorkerLock{worker: worker, cc: cfg, changed: changed, cancel: cancel, done: make(chan struct{})}
	w.held.Store(true)
	go w.keep(wctx, conn, min(5*time.Second, max(time.Second, lease/3)))
	return w, nil
}

// takeWorkerLock connects and takes the lock, or says who holds it.
func takeWorkerLock(ctx context.Context, cfg *pgx.ConnConfig, worker string) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("worker id lock: %w", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+workerLockKey+`)`, worker).Scan(&got); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("worker id lock: %w", err)
	}
	if got {
		return conn, nil
	}
	holder := workerLockHolder(ctx, conn, worker)
	conn.Close(context.Background())
	return nil, &WorkerIDInUseError{Worker: worker, Holder: holder}
}

// workerLockHolder describes the session holding the worker id's lock
// and the id's last registered daemon, best effort.
func workerLockHolder(ctx context.Context, conn *pgx.Conn, worker string) string {
	var (
		pid           int32
		client, since string
	)
	err := conn.QueryRow(ctx, `SELECT a.pid, coalesce(host(a.client_addr), 'a local socket'),
		       to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND ((l.classid::int8 << 32) | l.objid::int8) = `+workerLockKey+`
		LIMIT 1`, worker).Scan(&pid, &client, &since)
	if err != nil {
		return "its session is not visible to this database role"
	}
	s := fmt.Sprintf("PostgreSQL backend %d, client %s, connected %s", pid, client, since)
	var (
		host           string
		wpid           int32
		started, lastS string
	)
	// absent before the schema's first migration, and for a one-shot run
	if conn.QueryRow(ctx, `SELECT hostname, pid,
		       to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
		       to_char(last_seen AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		FROM intake_worker WHERE worker_id = $1`, worker).Scan(&host, &wpid, &started, &lastS) == nil {
		s += fmt.Sprintf("; the id's last registered daemon: pid %d on %s, started %s, last seen %s", wpid, host, started, lastS)
	}
	return s
}

// keep watches the lock's session and takes the lock again when it ends.
func (w *WorkerLock) keep(ctx context.Context, conn *pgx.Conn, retry time.Duration) {
	defer close(w.done)
	for {
		// no notification ever comes: this returns when the session
		// ends (or on Release)
		err := conn.PgConn().WaitForNotification(ctx)
		conn.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		w.held.Store(false)
		w.changed(false, err)
		told := false
		// soon at first (a PostgreSQL restart is over in seconds), then
		// every retry
		wait := 100 * time.Millisecond
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, retry)
			tctx, cancel := context.WithTimeout(ctx, retry)
			c, err := takeWorkerLock(tctx, w.cc, w.worker)
			cancel()
			if err == nil {
				conn = c
				break
			}
			var inUse *WorkerIDInUseError
			if errors.As(err, &inUse) && !told {
				told = true // another process took the id meanwhile: said once
				w.changed(false, err)
			}
		}
		w.held.Store(true)
		w.changed(true, nil)
	}
}

// Held reports whether this process holds its worker id now.
func (w *WorkerLock) Held() bool { return w != nil && w.held.Load() }

// Release lets the worker id go (the lock's session ends) and waits for
// the watcher to end. Safe more than once.
func (w *WorkerLock) Release() {
	if w == nil {
		return
	}
	w.held.Store(false)
	w.cancel()
	<-w.done
}
