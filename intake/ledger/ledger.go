// Package ledger is intake's record of every file: it owns every statement
// on file_intake and its satellite tables (intake_batch, intake_chunk,
// intake_row_issue, intake_quarantine, intake_audit) and on the replicas'
// heartbeats and polls (intake_worker, intake_partner_poll), which the
// leases and takeovers of those rows depend on. The pipeline (intake), the
// reconciler (reconcile) and the ops views (intake/ops) call it and write
// no SQL on these tables themselves; the one exception is the merge
// statement of intake/target (merge.go), which records the rows it holds
// back in intake_row_issue as part of the same statement.
package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Ledger holds every statement on file_intake and its satellite tables
// (intake_batch, intake_chunk, intake_row_issue, intake_quarantine,
// intake_audit, and the replicas' intake_worker and intake_partner_poll).
// Each state change is one conditional statement on (intake_id,
// fencing_token, state): never read-compare-write in Go. Where a statement
// must commit with the target rows (a chunk, a group), it takes the
// caller's pgx.Tx or is queued onto the caller's *pgx.Batch.
//
// Its statements are grouped by concern into the types it embeds, each
// over the one core they share (the pools and the lease); a caller names
// them all on the Ledger.
type Ledger struct {
	*core
	claimStore
	replicas
	leaseStore
	fileSteps
	groupSteps
	chunkStore
	approvals
	reconcilerView
	opsDecisions
	consoleReads
	expectations
	outboxStore
	purges
	recordClaims
	siteProfiles
	readySeen
	statusReads
}

// core is what the ledger's parts share: the pools its statements run on
// and the lease it grants.
type core struct {
	pool *pgxpool.Pool
	// read is what the status and console reads run on: pool, or a
	// Snapshot's transaction
	read   Reader
	claims *pgxpool.Pool // the claim sections' connections (ClaimLock); nil: pool
	lease  time.Duration
	// the heartbeats' and lease renewals' pool (WithBeatPool; a fence's
	// when pool has no idle connection): made from
	// beatCfg when first needed, closed by CloseBeats; none: pool
	beatMu     sync.Mutex
	beatCfg    *pgxpool.Config
	beats      *pgxpool.Pool
	beatClosed bool
}

// New returns the ledger on db; lease is the claim lease to grant.
func New(db *pgxpool.Pool, lease time.Duration) *Ledger {
	c := &core{pool: db, read: db, lease: lease}
	return &Ledger{
		core:           c,
		claimStore:     claimStore{c},
		replicas:       replicas{c},
		leaseStore:     leaseStore{c},
		fileSteps:      fileSteps{c},
		groupSteps:     groupSteps{c},
		chunkStore:     chunkStore{c},
		approvals:      approvals{c},
		reconcilerView: reconcilerView{core: c, workers: replicas{c}},
		opsDecisions:   opsDecisions{c},
		consoleReads:   consoleReads{c},
		expectations:   expectations{c},
		outboxStore:    outboxStore{c},
		purges:         purges{c},
		recordClaims:   recordClaims{core: c, claim: claimStore{c}},
		siteProfiles:   siteProfiles{c},
		readySeen:      readySeen{c},
		statusReads:    statusReads{c},
	}
}

// Reader is a pool or a transaction, for reads.
type Reader interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Snapshot runs fn on a ledger whose status reads (those `intake status`
// makes: StateCounts, OpenHolds, Polls, ApplyingFiles, LateWindows,
// AwaitingApproval, SiteProfiles, LiveServing, and LastRuns and
// StoredFindings given its Reader) all see one moment: a read-only
// REPEATABLE READ transaction, so their figures agree with each other
// while files move. Its other statements run on db as ever.
func Snapshot(ctx context.Context, db *pgxpool.Pool, fn func(l *Ledger, r Reader) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		l := New(db, DefaultLease)
		l.core.read = tx
		return fn(l, tx)
	})
}

// WithClaimPool has the partners' claim sections (ClaimLock) hold their
// lock on connections of claims instead of the ledger's pool. A section
// holds its connection while the claim renames cross the network (one
// round trip to the partner's site, 50 ms at a distant site): on the
// pool that does the files' work, ten partners claiming at once kept
// every connection idle in their sections and the groups' commits and
// fences waited for them (docs/performance.md). A connection
// idle in a section costs PostgreSQL no CPU, so this pool is sized for
// the latency, not the database's cores. It returns l.
func (l *Ledger) WithClaimPool(claims *pgxpool.Pool) *Ledger {
	l.claims = claims
	return l
}

// WithBeatPool has the replica's heartbeat and the files' lease renewals
// run on a pool of their own (a file's fence, Heartbeat, when the work
// pool has no idle connection), made from pc when first needed (CloseBeats
// closes it). Long chunks may hold every connection of the pool the
// files' work runs on for longer than a lease; a heartbeat queued behind
// them would let the replica's row and its files' leases go stale while
// it works, and another replica would take its live work over. It
// returns l.
func (l *Ledger) WithBeatPool(pc *pgxpool.Config) *Ledger {
	l.beatCfg = pc
	return l
}

// beat is the pool heartbeats run on.
func (l *core) beat() *pgxpool.Pool {
	l.beatMu.Lock()
	defer l.beatMu.Unlock()
	if l.beats == nil && l.beatCfg != nil && !l.beatClosed {
		// connects lazily: no error but a bad configuration, which the
		// work pool's copy cannot be
		if p, err := pgxpool.NewWithConfig(context.Background(), l.beatCfg); err == nil {
			l.beats = p
		}
	}
	if l.beats != nil {
		return l.beats
	}
	return l.pool
}

// CloseBeats closes the heartbeat pool, once nothing renews a lease on
// it; a later heartbeat runs on the ledger's pool.
func (l *core) CloseBeats() {
	l.beatMu.Lock()
	defer l.beatMu.Unlock()
	l.beatClosed = true
	if l.beats != nil {
		l.beats.Close()
		l.beats = nil
	}
}

// Lease is the claim lease the ledger grants.
func (l *core) Lease() time.Duration { return l.lease }

// AppName is the PostgreSQL application_name of a worker's connections,
// which a takeover ends a stalled owner's sessions by (endStalled).
// PostgreSQL cuts an application_name at 63 bytes, and a worker id may
// have 63 characters: a name that would be cut ends in a hash of the
// whole id instead, so it is stored as given and two ids alike in their
// first characters keep two names.
func AppName(worker string) string {
	const prefix, max = "partner-intake/", 63
	if len(prefix)+len(worker) <= max {
		return prefix + worker
	}
	sum := sha256.Sum256([]byte(worker))
	tail := "~" + hex.EncodeToString(sum[:4])
	return prefix + worker[:max-len(prefix)-len(tail)] + tail
}

// query reads the rows of file_intake that match where, by intake id.
func (l *core) query(ctx context.Context, where string, args ...any) ([]*Intake, error) {
	rs, err := l.pool.Query(ctx, `SELECT `+intakeColumns+` FROM file_intake WHERE `+where+` ORDER BY intake_id`, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (*Intake, error) { return scanIntake(r) })
}

// reconcilerView is the reconciler's: its reads of file_intake (expired,
// unknown, quarantined rows) and the takeovers of expired claims (matrix
// rows 1, 5, 9 and the quarantine report).
type reconcilerView struct {
	*core
	workers replicas // whether an owner is alive or gone
}

// Expired lists the partner's live rows whose lease ran out (other than
// outcome_unknown, which is resolved from the ledger first).
func (l *reconcilerView) Expired(ctx context.Context, partner string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND state = ANY($2) AND state <> 'outcome_unknown' AND lease_until < pg_catalog.now()`, partner, liveStates)
}

// Unknown lists the partner's rows in outcome_unknown.
func (l *reconcilerView) Unknown(ctx context.Context, partner string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND state = 'outcome_unknown'`, partner)
}

// OpenHeld lists the partner's rows held for an ops decision: their
// quarantine record open (quarantined, or failed for good), as OpenHolds
// counts them.
func (l *reconcilerView) OpenHeld(ctx context.Context, partner string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND intake_id IN (SELECT q.intake_id FROM intake_quarantine q WHERE q.partner_id = $1 AND q.state = 'open')`, partner)
}

// Get returns the partner's row with that id, or nil.
func (l *reconcilerView) Get(ctx context.Context, partner string, id int64) (*Intake, error) {
	rows, err := l.query(ctx, `partner_id = $1 AND intake_id = $2`, partner, id)
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	return rows[0], nil
}

// AnyDue reports whether one of the rows ids is due for a run now: not
// waiting out a retry's backoff.
func (l *reconcilerView) AnyDue(ctx context.Context, ids []int64) (bool, error) {
	var due bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM file_intake WHERE intake_id = ANY($1::int8[])
		AND (next_attempt_at IS NULL OR next_attempt_at <= pg_catalog.now()))`, ids).Scan(&due)
	return due, err
}

// GetMany returns the partner's rows of ids by id; an id no row of the
// partner has is absent.
func (l *reconcilerView) GetMany(ctx context.Context, partner string, ids []int64) (map[int64]*Intake, error) {
	rows, err := l.query(ctx, `partner_id = $1 AND intake_id = ANY($2::int8[])`, partner, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]*Intake, len(rows))
	for _, in := range rows {
		out[in.ID] = in
	}
	return out, nil
}

// Owned reports whether a live row owns a processing path.
func (l *reconcilerView) Owned(ctx context.Context, partner, claimedPath string) (bool, error) {
	var ok bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM file_intake
		WHERE partner_id = $1 AND claimed_path = $2 AND state = ANY($3))`, partner, claimedPath, holdingStates).Scan(&ok)
	return ok, err
}

// NamingManifest lists the partner's rows that own a claimed path (the
// holding states) and name manifest as their manifest, which lies beside
// their claimed path: whose a manifest found in processing/ is.
func (l *reconcilerView) NamingManifest(ctx context.Context, partner, manifest string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND manifest_name = $2 AND state = ANY($3)`, partner, manifest, holdingStates)
}

// WorkerAlive reports whether a replica heartbeated within its lease.
func (l *replicas) WorkerAlive(ctx context.Context, worker string) (bool, error) {
	var ok bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM intake_worker
		WHERE worker_id = $1 AND last_seen > pg_catalog.now() - lease)`, worker).Scan(&ok)
	return ok, err
}

// PathHeld reports whether err is a claimed path's unique index refusing
// a row's move onto a path another live intake of the partner holds (a
// takeover into a processing dir where the same name waits).
func PathHeld(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "file_intake_live_path"
}

// TakeOver hands an expired claim to worker at newPath with a new fencing
// token, in one conditional statement: it succeeds only if the lease is
// still expired and the token is the one observed. The old owner's later
// writes then fail on the token; its SFTP operations fail once the file is
// renamed into processing/<worker>/. It runs on the partner's claim
// section's transaction (ClaimLock.TakeOver): the new token and path
// commit with the section, after the move the caller makes in it, so a
// taker paused past a lease between the two (its section's session
// ended) leaves the row as it was, owning the file where it still is,
// rather than a row naming a path the file never reached while an
// adopter, finding no live row at the file's path, records it again.
//
// A stalled owner (its replica no longer heartbeats) may still hold the row lock inside a transaction that
// will never finish by itself (a COPY waiting for its frozen client is not
// ended by statement_timeout). When the update cannot get the lock, the old
// worker's transactions older than the lease are terminated — its lease
// has expired, so they can only be a zombie's — and the update is tried
// once more. This needs the daemons to share a role (or pg_signal_backend).
func (l *reconcilerView) takeOverIn(ctx context.Context, tx pgx.Tx, in *Intake, worker, newPath string) (*Intake, error) {
	for attempt := 1; ; attempt++ {
		out, err := l.takeOver(ctx, tx, in, worker, newPath)
		var pe *pgconn.PgError
		if attempt == 1 && errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "57014") {
			// The row is locked: the owner is inside a chunk transaction.
			// A live owner (its replica heartbeats) is working, however
			// long the chunk takes: it renews the lease when the chunk
			// commits, and is neither taken over nor ended.
			alive, aerr := l.workers.WorkerAlive(ctx, in.Worker)
			if aerr != nil {
				return nil, fmt.Errorf("takeover: is the owner alive: %w", aerr)
			}
			if alive {
				return nil, &FencedError{IntakeID: in.ID, Token: in.Token, Step: "takeover (the owner is alive, inside a chunk)"}
			}
			if kerr := l.endStalled(ctx, in.Worker); kerr != nil {
				return nil, fmt.Errorf("takeover: end the stalled owner's session: %w", kerr)
			}
			continue
		}
		if err == nil && in.Worker != worker {
			// A worker frozen part way through a file applied ahead of its
			// plan holds rows of it in an open transaction without the
			// file's row lock (intake/ahead.go), which the new owner's
			// statements would wait for: the sessions of an owner known to
			// be gone (past its lease, or retired; a `run --once`, which
			// never registers, is not) whose transactions outlived a lease
			// are ended here too. Best effort: the file is taken over
			// either way.
			if gone, gerr := l.workers.WorkerGone(ctx, in.Worker); gerr == nil && gone {
				l.endStalled(ctx, in.Worker)
			}
		}
		return out, err
	}
}

// takeOver is the takeover's statement on tx, under a savepoint: a
// refusal (a lock not had within a second, the path held) leaves tx as it
// was.
func (l *reconcilerView) takeOver(ctx context.Context, tx pgx.Tx, in *Intake, worker, newPath string) (*Intake, error) {
	if _, err := tx.Exec(ctx, `SAVEPOINT takeover`); err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	row := tx.QueryRow(ctx, `UPDATE file_intake SET fencing_token = fencing_token + 1, worker_id = $3,
		claimed_path = $4, lease_until = pg_catalog.now() + $5::interval, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = ANY($6) AND lease_until < pg_catalog.now()
		RETURNING `+intakeColumns, in.ID, in.Token, worker, newPath, l.lease, liveStates)
	out, err := scanIntake(row)
	if err != nil {
		if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT takeover`); rerr != nil {
			return nil, fmt.Errorf("takeover: %w", rerr)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, &FencedError{IntakeID: in.ID, Token: in.Token, Step: "takeover"}
		}
		return nil, err
	}
	return out, nil
}

// restorePath points a row just taken over (in tx, the section's) back
// at where its file still is (the takeover's move into the new owner's
// processing/ failed, the file untouched), under the takeover's token:
// the new owner runs the file from there.
func restorePath(ctx context.Context, tx pgx.Tx, in *Intake, path string) error {
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET claimed_path = $3, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = ANY($4)`, in.ID, in.Token, path, liveStates)
	if err := fenced(tag, err, in, "restore path"); err != nil {
		return err
	}
	in.ClaimedPath = path
	return nil
}

// endStalled terminates the old worker's transactions that have run longer
// than a lease, waiting up to 5 s for each to end. A session is the old
// worker's only if it carries its application_name and is logged in as
// intake's own user to this database: any client may set an
// application_name, and a session of another user or database that took
// a worker's name is never ended.
func (l *reconcilerView) endStalled(ctx context.Context, oldWorker string) error {
	_, err := l.pool.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(pid, 5000::int8) FROM pg_catalog.pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_catalog.pg_backend_pid()
		  AND usesysid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)
		  AND datid = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
		  AND xact_start < pg_catalog.now() - $2::interval`, AppName(oldWorker), l.lease)
	return err
}

// ResolveUnknown reads the chunk ledger of a file in outcome_unknown and
// puts it back to applying with a new token and an expired lease: the
// owner (or, after a takeover, another worker) resumes after the last chunk
// the ledger holds. The ledger and the progress counter are written in the
// same transaction as the chunk's rows, so they always agree; a
// disagreement is reported, not guessed at. A file whose episode spent its
// retry budget (MarkUnknown) keeps reason retries_exhausted: its next run
// fails it for good, with the chunks the ledger holds counted.
func (l *reconcilerView) ResolveUnknown(ctx context.Context, in *Intake) (chunks int, err error) {
	var done int
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM intake_chunk WHERE intake_id = $1`, in.ID).Scan(&chunks); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `UPDATE file_intake SET state = 'applying', reason = CASE WHEN reason = 'retries_exhausted' THEN reason END,
			fencing_token = fencing_token + 1, lease_until = pg_catalog.now(), updated_at = pg_catalog.now()
			WHERE intake_id = $1 AND fencing_token = $2 AND state = 'outcome_unknown' AND chunks_done = $3
			RETURNING chunks_done`, in.ID, in.Token, chunks).Scan(&done)
		if errors.Is(err, pgx.ErrNoRows) {
			return &FencedError{IntakeID: in.ID, Token: in.Token, Step: fmt.Sprintf("resolve unknown (ledger holds %d chunks)", chunks)}
		}
		return err
	})
	return chunks, err
}

// DefaultLease is how long a claim is held without a heartbeat unless the
// daemon's configuration says otherwise.
const DefaultLease = 2 * time.Minute

// NoFeed is the feed of a file that matches none (a hostile entry).
const NoFeed = "-"

// ErrDecision is wrapped by every refused decision.
var ErrDecision = errors.New("decision refused")
