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
// session-level advisory lock (WorkerLock): a daemon on a connection of its
// own, which the points below are about; a one-shot run on a connection of
// its pool (TakeWorkerLockOnPool). Each time it takes the lock is a Hold of
// its own:
//
//   - The lock ends with its session. A process that exits or is killed
//     releases it at once (its socket closes). A host that is gone, frozen
//     or cut off releases it only when PostgreSQL's keepalives give up on
//     it, set on this connection to take at least a lease and 30 s
//     (idle 30 s, then 3 probes lease/3 apart; tcp_user_timeout the same,
//     so a server's shorter setting does not cut it; idle_session_timeout
//     off), so that the files of a process that stopped answering have
//     run out their leases before another process of the id resumes them
//     at once.
//   - The holder knows its hold only as far as it checked it: a session
//     the server ends (a PostgreSQL restart, a terminate) is seen at once,
//     and otherwise a round trip checks the session every lease/6. A hold
//     counts (Held, HeldIn) only while its last check, timed from before
//     it was sent, is younger than lease/2, so a holder cut off stops
//     counting itself the holder well before the server lets the lock go.
//   - When a hold ends the lock is taken again; a hold taken again is a
//     new Hold, so what was checked under the old one (a group's fence, a
//     poll's right to take files) does not carry over.
//
// A transaction-mode connection pooler between intake and PostgreSQL would
// hand the lock's backend to other clients: intake needs session pooling
// or none.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// workerLockKeyOf is the advisory lock key of the worker id in parameter
// worker; workerLockKey that of the first parameter.
func workerLockKeyOf(worker string) string {
	return `pg_catalog.hashtextextended('partner-intake/worker/'::text || (` + worker + `)::text, 0::int8)`
}

var workerLockKey = workerLockKeyOf("$1")

// workerLockHeldBy finds the session holding the lock of the worker id
// in parameter worker in this database (advisory locks are a database's
// own).
func workerLockHeldBy(worker string) string {
	return `l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
	  AND ((l.classid::int8 << 32) | l.objid::int8) = ` + workerLockKeyOf(worker)
}

// workerLockHeld is workerLockHeldBy the first parameter.
var workerLockHeld = workerLockHeldBy("$1")

// workerLockHeldByBackend is true while the backend in parameter pid
// holds the lock of the worker id in parameter worker.
func workerLockHeldByBackend(worker, pid string) string {
	return `EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE ` + workerLockHeldBy(worker) + ` AND l.pid = ` + pid + `)`
}

// WorkerIDInUseError: another live session holds the worker id's lock.
type WorkerIDInUseError struct {
	Worker string
	Holder string // who holds it, as far as the database tells
}

func (e *WorkerIDInUseError) Error() string {
	return fmt.Sprintf("worker id %s is in use by another live process (%s): two processes must not run as one worker id; give each its own worker_id (reason worker_id_in_use)", e.Worker, e.Holder)
}

// Hold is one taking of the worker id's lock: what was checked under it
// stands while it is the current one (HeldIn).
type Hold struct {
	_ byte // not zero-sized: two holds are never one pointer
}

// WorkerLock is a process's hold on its worker id.
type WorkerLock struct {
	worker string
	cfg    *pgx.ConnConfig
	check  time.Duration // how often the session is checked
	valid  time.Duration // how long a check vouches for the hold
	hooks  WorkerLockHooks

	// pooled: the lock is held by a connection of the process's pool
	// (TakeWorkerLockOnPool), at that connection's backend; no watcher
	pooled bool
	pool   *pgxpool.Pool
	lease  time.Duration
	poolMu sync.Mutex
	at     Pooled

	sessPID  atomic.Uint32 // the backend of the lock's own connection (not pooled)
	base     time.Time     // the monotonic clock's origin for verified
	verified atomic.Int64  // ns since base when the last good check was sent
	cur      atomic.Pointer[Hold]
	cancel   context.CancelFunc
	done     chan struct{}
}

// WorkerLockHooks are what the holder is told. Changed: the hold ended
// (err says why), another process took the id meanwhile (a
// *WorkerIDInUseError, once a loss), the lock could not be taken again for
// another reason (once a loss), or it is held again (held true). Regained
// runs when the lock was taken again, before the new hold counts.
type WorkerLockHooks struct {
	Changed  func(held bool, err error)
	Regained func(ctx context.Context)
}

// session is a lock session's backend, to know it again.
type session struct {
	pid   uint32
	start time.Time
}

// TryWorkerLock takes the worker id's lock for this process on a
// connection of its own (cc: the pool's config), or returns a
// *WorkerIDInUseError naming the holder at once.
func TryWorkerLock(ctx context.Context, cc *pgx.ConnConfig, worker string, lease time.Duration, hooks WorkerLockHooks) (*WorkerLock, error) {
	return newWorkerLock(ctx, cc, worker, lease, hooks, nil)
}

// WaitWorkerLock is TryWorkerLock that, when another process holds the
// id, calls inUse once with who it is and waits until the lock is free
// (one waiting statement, not a poll), or ctx ends.
func WaitWorkerLock(ctx context.Context, cc *pgx.ConnConfig, worker string, lease time.Duration, hooks WorkerLockHooks, inUse func(*WorkerIDInUseError)) (*WorkerLock, error) {
	return newWorkerLock(ctx, cc, worker, lease, hooks, inUse)
}

func newWorkerLock(ctx context.Context, cc *pgx.ConnConfig, worker string, lease time.Duration, hooks WorkerLockHooks, inUse func(*WorkerIDInUseError)) (*WorkerLock, error) {
	if hooks.Changed == nil {
		hooks.Changed = func(bool, error) {}
	}
	if hooks.Regained == nil {
		hooks.Regained = func(context.Context) {}
	}
	w := &WorkerLock{worker: worker, cfg: WorkerLockConnConfig(cc, worker, lease), hooks: hooks,
		check: max(500*time.Millisecond, lease/6), valid: max(time.Second, lease/2), base: time.Now(), done: make(chan struct{})}
	conn, me, err := w.take(ctx, session{}, inUse)
	if err != nil {
		return nil, err
	}
	// the lock was just granted on this session (a wait for it may have
	// lasted hours): checked now
	w.verified.Store(int64(time.Since(w.base)))
	w.sessPID.Store(me.pid)
	w.cur.Store(newHold())
	wctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.keep(wctx, conn, me)
	return w, nil
}

func newHold() *Hold { return new(Hold) }

// WorkerLockConnConfig is the lock connection's config: the pool's, with
// keepalives that give up on a silent client after at least a lease and
// 30 s, and no timeout that ends the session or its waiting statement.
func WorkerLockConnConfig(cc *pgx.ConnConfig, worker string, lease time.Duration) *pgx.ConnConfig {
	c := cc.Copy()
	const idle, count = 30, 3
	interval := max(1, int((lease+3*time.Second-1)/(3*time.Second)))
	c.RuntimeParams["application_name"] = AppName(worker)
	c.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(idle)
	c.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(interval)
	c.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(count)
	c.RuntimeParams["tcp_user_timeout"] = strconv.Itoa((idle + count*interval) * 1000)
	c.RuntimeParams["idle_session_timeout"] = "0"
	c.RuntimeParams["statement_timeout"] = "0"
	c.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	return c
}

// take connects and takes the lock. A lock still held by prev, this
// process's own earlier session that the server has not seen gone yet (the
// process already stopped counting itself the holder), is ended and taken.
// When another session holds it: a *WorkerIDInUseError, or with inUse,
// that error passed to inUse and a wait for the lock.
func (w *WorkerLock) take(ctx context.Context, prev session, inUse func(*WorkerIDInUseError)) (*pgx.Conn, session, error) {
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return nil, session{}, fmt.Errorf("worker id lock: %w", err)
	}
	fail := func(err error) (*pgx.Conn, session, error) {
		conn.Close(context.Background())
		return nil, session{}, err
	}
	// the session's start is read by its first check, off the taking's
	// path (a fresh backend's first look at pg_stat_activity reads the
	// catalog)
	me := session{pid: conn.PgConn().PID()}
	try := func() (bool, error) {
		var got bool
		err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock(`+workerLockKey+`)`, w.worker).Scan(&got)
		return got, err
	}
	got, err := try()
	// A process of the id that just ended (a daemon stopped, a one-shot
	// run before this one) holds it until PostgreSQL has handled its
	// disconnect: the id is asked again for a few seconds before it
	// counts as in use, as TakeWorkerLockOnPool does (not when taking it
	// again after a loss: its own earlier session is ended below).
	for deadline := time.Now().Add(inUseGrace); err == nil && !got && inUse == nil && prev.pid == 0 && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("worker id lock: %w", ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
		got, err = try()
	}
	if err != nil {
		return fail(fmt.Errorf("worker id lock: %w", err))
	}
	if got {
		return conn, me, nil
	}
	h, desc := workerLockHolder(ctx, conn, w.worker)
	if prev.pid != 0 && h.pid == prev.pid && h.start.Equal(prev.start) {
		if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend($1::int4, 5000::int8)`, int64(h.pid)); err == nil {
			if got, err = try(); err != nil {
				return fail(fmt.Errorf("worker id lock: %w", err))
			}
			if got {
				return conn, me, nil
			}
		}
		h, desc = workerLockHolder(ctx, conn, w.worker)
	}
	e := &WorkerIDInUseError{Worker: w.worker, Holder: desc}
	if inUse == nil {
		return fail(e)
	}
	inUse(e)
	if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_advisory_lock(`+workerLockKey+`)`, w.worker); err != nil {
		return fail(fmt.Errorf("worker id lock: wait: %w", err))
	}
	return conn, me, nil
}

// workerLockHolder names the session holding the worker id's lock, and
// describes it and the id's last registered daemon, best effort.
func workerLockHolder(ctx context.Context, conn *pgx.Conn, worker string) (session, string) {
	var (
		s             session
		client, since string
	)
	err := conn.QueryRow(ctx, `SELECT a.pid, a.backend_start, coalesce(host(a.client_addr), 'a local socket'),
		       pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE `+workerLockHeld+` LIMIT 1`, worker).Scan(&s.pid, &s.start, &client, &since)
	if err != nil {
		return session{}, "its session is not visible to this database role"
	}
	desc := fmt.Sprintf("PostgreSQL backend %d, client %s, connected %s", s.pid, client, since)
	var (
		host           string
		wpid           int32
		started, lastS string
	)
	// absent before the schema's first migration, and for a one-shot run
	if conn.QueryRow(ctx, `SELECT hostname, pid,
		       pg_catalog.to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
		       pg_catalog.to_char(last_seen AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		FROM intake_worker WHERE worker_id = $1`, worker).Scan(&host, &wpid, &started, &lastS) == nil {
		desc += fmt.Sprintf("; the id's last registered daemon: pid %d on %s, started %s, last seen %s", wpid, host, started, lastS)
	}
	return s, desc
}

// keep checks the hold's session, ends the hold when the session ends,
// and takes the lock again as a new hold.
func (w *WorkerLock) keep(ctx context.Context, conn *pgx.Conn, me session) {
	defer close(w.done)
	for {
		err := w.watch(ctx, conn, &me)
		w.cur.Store(nil)
		conn.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		w.hooks.Changed(false, err)
		if conn, me = w.retake(ctx, me); conn == nil {
			return
		}
		w.sessPID.Store(me.pid)
		h := newHold()
		w.hooks.Regained(ctx)
		if ctx.Err() != nil {
			conn.Close(context.Background())
			return
		}
		w.verified.Store(int64(time.Since(w.base)))
		w.cur.Store(h)
		w.hooks.Changed(true, nil)
	}
}

// watch returns when the session is found gone: at once when the server
// ends it, else at a check that fails.
func (w *WorkerLock) watch(ctx context.Context, conn *pgx.Conn, me *session) error {
	for {
		// no notification ever comes: this returns when the session ends,
		// or at the check's time
		wctx, cancel := context.WithTimeout(ctx, w.check)
		err := conn.PgConn().WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !pgconn.Timeout(err) {
			return err
		}
		sent := time.Since(w.base)
		pctx, cancel := context.WithTimeout(ctx, w.check)
		if me.start.IsZero() {
			err = conn.QueryRow(pctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_catalog.pg_backend_pid()`).Scan(&me.start)
		} else {
			err = conn.Ping(pctx)
		}
		cancel()
		if err != nil {
			return err
		}
		w.verified.Store(int64(sent))
	}
}

// retake takes the lock again after a hold ended, waiting while another
// process holds it; nil when ctx ended first.
func (w *WorkerLock) retake(ctx context.Context, prev session) (*pgx.Conn, session) {
	told, toldErr := false, false
	inUse := func(e *WorkerIDInUseError) {
		if !told {
			told = true
			w.hooks.Changed(false, e)
		}
	}
	wait := 100 * time.Millisecond // soon at first: a PostgreSQL restart is over in seconds
	for {
		select {
		case <-ctx.Done():
			return nil, session{}
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
		conn, me, err := w.take(ctx, prev, inUse)
		if err == nil {
			return conn, me
		}
		if ctx.Err() != nil {
			return nil, session{}
		}
		if !toldErr {
			toldErr = true
			w.hooks.Changed(false, err)
		}
	}
}

// Current is the hold now, or nil when the lock is not held or its last
// check is too old to count.
func (w *WorkerLock) Current() *Hold {
	if w == nil {
		return nil
	}
	h := w.cur.Load()
	if h == nil || (!w.pooled && time.Since(w.base)-time.Duration(w.verified.Load()) >= w.valid) {
		return nil
	}
	return h
}

// Pooled is where a pooled lock (TakeWorkerLockOnPool) is held now: the
// backend of the pool's connection and the server's start; the zero
// Pooled for a lock on a connection of its own. Every fence of a pooled
// hold asks the database whether that backend still holds the lock
// (Ledger.Heartbeat with HeldBy), and every step that takes a file as the id's
// first checks it (CheckPooled).
type Pooled struct {
	PID   uint32
	Since time.Time // pg_postmaster_start_time(): a pid is a server's own
}

// HolderPID is the backend that holds the lock for this process as far
// as it knows: its own connection's, or the pooled connection's.
func (w *WorkerLock) HolderPID() uint32 {
	if w == nil {
		return 0
	}
	if w.pooled {
		return w.Pooled().PID
	}
	return w.sessPID.Load()
}

// Pooled returns the pooled lock's holder now (zero when not pooled).
func (w *WorkerLock) Pooled() Pooled {
	if w == nil || !w.pooled {
		return Pooled{}
	}
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	return w.at
}

// TakeWorkerLockOnPool takes the worker id's lock on a connection of pool
// rather than one of its own: a one-shot run starts no second backend
// beside its logins for it (docs/performance.md). The connection
// goes back to the pool holding the lock. No watcher checks such a hold:
// each fence asks the database whether its backend still holds the lock,
// and CheckPooled, before each step that takes a file as the id's, takes
// it again on a connection of the pool when that backend's session ended
// (the pool closes a connection whose statement was cancelled). The
// session gets the lock session's keepalives. When another session holds
// the id: a *WorkerIDInUseError naming it.
func TakeWorkerLockOnPool(ctx context.Context, pool *pgxpool.Pool, worker string, lease time.Duration, hooks WorkerLockHooks) (*WorkerLock, error) {
	if hooks.Changed == nil {
		hooks.Changed = func(bool, error) {}
	}
	// A process of the id that just ended (a one-shot run before this
	// one, a daemon killed) holds it until PostgreSQL has handled its
	// disconnect: the id is asked again for a few seconds before it
	// counts as in use.
	var at Pooled
	var err error
	for deadline := time.Now().Add(inUseGrace); ; {
		at, err = takeOnPool(ctx, pool, worker, lease)
		var inUse *WorkerIDInUseError
		if !errors.As(err, &inUse) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	close(done)
	w := &WorkerLock{worker: worker, hooks: hooks, pooled: true, pool: pool, lease: lease, at: at,
		base: time.Now(), cancel: func() {}, done: done}
	w.cur.Store(newHold())
	return w, nil
}

// inUseGrace is how long a one-shot run asks again for a worker id that
// another session holds before it gives up.
const inUseGrace = 5 * time.Second

// takeOnPool takes the lock on a connection of pool.
func takeOnPool(ctx context.Context, pool *pgxpool.Pool, worker string, lease time.Duration) (Pooled, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return Pooled{}, fmt.Errorf("worker id lock: %w", err)
	}
	defer c.Release()
	p := WorkerLockConnConfig(pool.Config().ConnConfig, worker, lease).RuntimeParams
	var (
		got bool
		at  = Pooled{PID: c.Conn().PgConn().PID()}
	)
	if err := c.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock(`+workerLockKey+`), pg_catalog.pg_postmaster_start_time(),
		       pg_catalog.set_config('tcp_keepalives_idle', $2, false), pg_catalog.set_config('tcp_keepalives_interval', $3, false),
		       pg_catalog.set_config('tcp_keepalives_count', $4, false), pg_catalog.set_config('tcp_user_timeout', $5, false),
		       pg_catalog.set_config('idle_session_timeout', '0', false)`,
		worker, p["tcp_keepalives_idle"], p["tcp_keepalives_interval"], p["tcp_keepalives_count"], p["tcp_user_timeout"]).Scan(&got, &at.Since, nil, nil, nil, nil, nil); err != nil {
		return Pooled{}, fmt.Errorf("worker id lock: %w", err)
	}
	if !got {
		_, desc := workerLockHolder(ctx, c.Conn(), worker)
		return Pooled{}, &WorkerIDInUseError{Worker: worker, Holder: desc}
	}
	// A one-shot run may leave a claim without a row in the id's dirs (a
	// kill between its RENAME and INSERT): the id's next daemon start must
	// look there, whatever its last run recorded.
	if _, err := c.Exec(ctx, undrainSQL, worker); err != nil {
		return Pooled{}, fmt.Errorf("worker id lock: %w", err)
	}
	return at, nil
}

// undrainSQL forgets that the worker id's last daemon run stopped drained.
const undrainSQL = `UPDATE intake_worker SET drained_at = NULL WHERE worker_id = $1 AND drained_at IS NOT NULL`

// CheckPooled makes sure a pooled lock is held: the database is asked
// whether its backend still holds it, and when not (that connection's
// session ended), the lock is taken again on a connection of the pool, or
// a *WorkerIDInUseError says who holds it now. Work begun before such a
// change is fenced by its rows' tokens and, when it publishes, by
// Heartbeat with HeldBy. A lock on a connection of its own: nil (its watcher
// checks it).
func (w *WorkerLock) CheckPooled(ctx context.Context) error {
	if w == nil || !w.pooled {
		return nil
	}
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	if w.cur.Load() == nil {
		return errors.New("the worker id was let go")
	}
	var held bool
	ask := func() error {
		return w.pool.QueryRow(ctx, `SELECT `+workerLockHeldByBackend("$1", "$2")+`
		AND pg_catalog.pg_postmaster_start_time() = $3`, w.worker, int64(w.at.PID), w.at.Since).Scan(&held)
	}
	err := ask()
	var pe *pgconn.PgError
	if err != nil && ctx.Err() == nil && (!errors.As(err, &pe) || strings.HasPrefix(pe.Code, "57") || strings.HasPrefix(pe.Code, "08")) {
		// the pool may hand out the very connection whose session ended
		// (its first statement then meets the server's goodbye, 57P01, or
		// the closed socket; the pool drops it): asked once more, on
		// another
		err = ask()
	}
	if err != nil {
		return fmt.Errorf("worker id lock: %w", err)
	}
	if held {
		return nil
	}
	at, err := takeOnPool(ctx, w.pool, w.worker, w.lease)
	if err != nil {
		w.hooks.Changed(false, err)
		return err
	}
	w.at = at
	return nil
}

// Held reports whether this process holds its worker id now.
func (w *WorkerLock) Held() bool { return w.Current() != nil }

// HeldIn reports whether h is the hold now: the lock was not lost (and
// maybe taken again) since h began.
func (w *WorkerLock) HeldIn(h *Hold) bool { return h != nil && w.Current() == h }

// Release lets the worker id go (the lock's session ends) and waits for
// the watcher to end. A pooled hold unlocks on its connection when that
// connection is idle in the pool: closing the pool alone ends the backend
// only once PostgreSQL has handled the disconnect, and a process of the
// id started right after (a cron's next one-shot run) would find the id
// still held. Otherwise its lock goes with the pool. Safe more than once.
func (w *WorkerLock) Release() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
	if w.pooled && w.cur.Load() != nil {
		w.unlockPooled()
	}
	w.cur.Store(nil) // a pooled hold's, which no watcher ends
}

// unlockPooled unlocks a pooled hold on the pool's connection that holds
// it (bounded: 2 s). That connection may be busy with another statement
// of the pool right now: the idle connections are looked through again
// until it is among them, so a process that ends its hold does not leave
// the id locked on a connection its pool keeps (the next process of the
// id on that pool would find it in use). A connection the pool closed
// meanwhile took the lock with it.
func (w *WorkerLock) unlockPooled() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	w.poolMu.Lock()
	pid := w.at.PID
	w.poolMu.Unlock()
	for {
		found, alive := false, false
		for _, c := range w.pool.AcquireAllIdle(ctx) {
			if c.Conn().PgConn().PID() == pid {
				found = true
				// every taking on this session: a lock taken again on a
				// connection that still held it (advisory locks stack)
				// would otherwise outlive the release
				for i := 0; i < 16; i++ {
					var more bool
					if err := c.QueryRow(ctx, `SELECT pg_catalog.pg_advisory_unlock(`+workerLockKey+`)`, w.worker).Scan(&more); err != nil || !more {
						break
					}
				}
			}
			c.Release()
		}
		if !found {
			// is the connection still open (busy), or gone with its lock?
			var n int
			if err := w.pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err == nil {
				alive = n > 0
			}
		}
		if found || !alive {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
