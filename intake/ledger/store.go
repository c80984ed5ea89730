package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// State is a file_intake state.
type State string

// The states of a file (see docs and DESIGN.md "Life of a file").
const (
	StateClaimed        State = "claimed"
	StateSpooled        State = "spooled"
	StateApplying       State = "applying"
	StateApplied        State = "applied"
	StateArchived       State = "archived"
	StateDuplicate      State = "duplicate"
	StateQuarantined    State = "quarantined"
	StateFailedTerminal State = "failed_terminal"
	StateOutcomeUnknown State = "outcome_unknown"
	StateDiscarded      State = "discarded"
	// StatePutBack: readiness stable, the file changed after its claim
	// (size or mtime differ when the download ends); it went back to
	// ready/ unapplied and a later poll takes it again as a new intake.
	StatePutBack State = "put_back"
	// StateAwaitingApproval: the file's plan needs an ops decision
	// (approval.go). It holds no lease and no worker works on it, but it
	// still owns its claimed path in processing/ (holdingStates).
	StateAwaitingApproval State = "awaiting_approval"
)

// liveStates are the states in which a worker owns the file (states.go).
var liveStates = statesWhere(func(i StateInfo) bool { return i.Live })

// holdingStates are the states in which a row owns its claimed path on
// the site (states.go).
var holdingStates = statesWhere(func(i StateInfo) bool { return i.Holding })

// FencedError means a conditional write found the row no longer in the
// expected state under this worker's fencing token: another worker took the
// file over, or it moved on. The worker must stop work on the file.
type FencedError struct {
	IntakeID int64
	Token    int64
	Step     string
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("intake %d: fenced out at %s (token %d is no longer current)", e.IntakeID, e.Step, e.Token)
}

// Intake is one file_intake row as a worker holds it.
type Intake struct {
	ID           int64
	Token        int64
	Partner      string
	Feed         string
	RemoteName   string
	ClaimedPath  string
	ManifestName string
	ListedSize   int64
	BatchID      string
	SHA256       string
	Size         int64
	ExpectedRows *int64
	State        State
	Reason       reason.Code
	Worker       string
	ClaimedAt    time.Time

	RowsTotal, RowsApplied, RowsUnchanged, RowsRejected, RowsConflict int64
	// RowsDeleted: rows a snapshot deleted or marked (outside the totals).
	RowsDeleted int64
	// RowsDeleteKept: rows a snapshot would have deleted but kept, edited
	// outside intake (outside the totals).
	RowsDeleteKept int64
	// RowsAppliedEarlier: rows the file's runs applied before ops released
	// it, which stand (outside the totals: the runs after a release count
	// them as unchanged).
	RowsAppliedEarlier int64
	// FeedSHA256: the hash of the feed configuration that planned the
	// file ("" before its plan).
	FeedSHA256                            string
	ChunksDone                            int
	ArchivePath, ReceiptPath, RejectsPath string
	// ReceiptPending: the latest decision (a discard) is not yet published
	// to the partner; ReceiptPath names the earlier decision's receipt.
	// A discarded file with no receipt path is not published either
	// (DiscardUnpublished).
	ReceiptPending bool
	// Override is what an ops release overrides (see Release); "" normally.
	Override string
	// ReplayOf is the intake whose bytes a replay applies again; 0 normally.
	ReplayOf int64
	// DataSHA256 and DataSize are the bytes rows come from: the expanded
	// bytes of a compressed file, else the file's own.
	DataSHA256 string
	DataSize   int64
	// ListedMTime is the file's mtime in the listing it was claimed from
	// (zero when unknown): readiness stable checks it when the download
	// ends.
	ListedMTime time.Time
	// PlanHash is the hash of the file's last plan against its target
	// ("" when its feed has no approval policy); ApprovedPlanHash the
	// hash ops approved; PlanDecision the ops decision its next run acts
	// on ("approved", "rejected" or "").
	PlanHash, ApprovedPlanHash, PlanDecision string
	// Attempts: the file's runs that failed or ended without knowing
	// whether their commit landed (outcome_unknown), since it was last
	// started over; its retry budget bounds them.
	Attempts int
}

// DiscardUnpublished reports whether in is a discarded file whose
// decision is not yet published to the partner (ledger.Undecided's rows).
func (in *Intake) DiscardUnpublished() bool {
	return in.State == StateDiscarded && (in.ReceiptPending || in.ReceiptPath == "")
}

const intakeColumns = `intake_id, fencing_token, partner_id, feed, remote_name, claimed_path,
	coalesce(manifest_name, ''), listed_size, coalesce(batch_id, ''), coalesce(content_sha256, ''),
	coalesce(size_bytes, 0), expected_rows, state, coalesce(reason, ''), worker_id, claimed_at,
	coalesce(rows_total, 0), rows_applied, rows_unchanged, rows_rejected, rows_conflict, chunks_done,
	coalesce(archive_path, ''), coalesce(receipt_path, ''), coalesce(rejects_path, ''),
	coalesce(release_override, ''), coalesce(replay_of, 0),
	coalesce(data_sha256, content_sha256, ''), coalesce(data_size, size_bytes, 0), listed_mtime, rows_deleted, rows_delete_kept,
	coalesce(feed_sha256, ''), coalesce(plan_hash, ''), coalesce(approved_plan_hash, ''), coalesce(plan_decision, ''), attempts, receipt_pending, rows_applied_earlier`

func scanIntake(r pgx.Row, extra ...any) (*Intake, error) {
	in := &Intake{}
	var st, why string
	var mtime *time.Time
	err := r.Scan(append([]any{&in.ID, &in.Token, &in.Partner, &in.Feed, &in.RemoteName, &in.ClaimedPath,
		&in.ManifestName, &in.ListedSize, &in.BatchID, &in.SHA256,
		&in.Size, &in.ExpectedRows, &st, &why, &in.Worker, &in.ClaimedAt,
		&in.RowsTotal, &in.RowsApplied, &in.RowsUnchanged, &in.RowsRejected, &in.RowsConflict, &in.ChunksDone,
		&in.ArchivePath, &in.ReceiptPath, &in.RejectsPath, &in.Override, &in.ReplayOf, &in.DataSHA256, &in.DataSize, &mtime, &in.RowsDeleted, &in.RowsDeleteKept, &in.FeedSHA256,
		&in.PlanHash, &in.ApprovedPlanHash, &in.PlanDecision, &in.Attempts, &in.ReceiptPending, &in.RowsAppliedEarlier}, extra...)...)
	in.State, in.Reason = State(st), reason.Code(why)
	if mtime != nil {
		in.ListedMTime = *mtime
	}
	return in, err
}

// ErrCommitLanded: a commit whose reply was lost had landed, and moved
// the file to applied (MarkUnknown read it so).
var ErrCommitLanded = errors.New("the commit landed: the file is applied")

// ErrTracked: a live row already owns that processing path.
var ErrTracked = errors.New("a live intake row already owns this path")

// claimStore claims files: a file's row inserted in file_intake with its
// intake id, alone or a group at once, the ids kept for the files' paths
// until then (intake_claim_id, claimid.go), and a partner's claim section
// (ClaimLock) whose renames it serializes across replicas.
type claimStore struct{ *core }

// InsertClaim records a claim found or adopted without one, under the
// id kept for its path, else a fresh one (insertClaimSQL); ErrTracked
// when a live row owns the path.
func (l *claimStore) InsertClaim(ctx context.Context, in *Intake) error {
	return l.insertClaim(ctx, l.pool, in)
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertClaimSQL records a claim found in processing/ without a row (an
// adoption), its lease from now (in a claim section the section's wait
// and its move came before): under the id its claim allocated, kept for
// its path (intake_claim_id: its place among the partner's claims), else
// a fresh one; a fresh one too when a row holds the kept id (the claim's
// commit landed after all). The kept id goes with the row, from every
// path that kept it; with no row recorded (a live row owns the path) it
// stays.
const insertClaimSQL = `
	WITH kept AS (
	    SELECT k.intake_id FROM intake_claim_id k
	    WHERE k.partner_id = $1 AND k.claimed_path = $4
	      AND NOT EXISTS (SELECT 1 FROM file_intake f WHERE f.intake_id = k.intake_id)),
	ins AS (
	    INSERT INTO file_intake (intake_id, partner_id, feed, remote_name, claimed_path, listed_size, manifest_name,
	                             state, worker_id, lease_until, listed_mtime)
	    OVERRIDING SYSTEM VALUE
	    VALUES (coalesce((SELECT intake_id FROM kept), pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('file_intake', 'intake_id'))),
	            $1, $2, $3, $4, $5, nullif($6, ''), 'claimed', $7, pg_catalog.clock_timestamp() + $8::interval, $9)` + recordedClaims

// recordedClaims ends a statement that records claims (the CTE ins, an
// INSERT into file_intake whose partner is $1): none over a path a live
// row owns, the ids kept for the recorded files (intake_claim_id) gone
// with their rows, the rows returned.
const recordedClaims = `
	    ON CONFLICT (partner_id, claimed_path)
	        WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown', 'awaiting_approval')
	        DO NOTHING
	    RETURNING ` + intakeColumns + `),
	gone AS (
	    DELETE FROM intake_claim_id WHERE partner_id = $1 AND intake_id IN (SELECT intake_id FROM ins))
	SELECT * FROM ins`

// insertClaim records in as claimed (insertClaimSQL), under the id kept
// for its path or a fresh one.
func (l *claimStore) insertClaim(ctx context.Context, q querier, in *Intake) error {
	row := q.QueryRow(ctx, insertClaimSQL, in.Partner, in.Feed, in.RemoteName, in.ClaimedPath, in.ListedSize, in.ManifestName, in.Worker, l.lease, nullTime(in.ListedMTime))
	got, err := scanIntake(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrTracked
	}
	if err != nil {
		return fmt.Errorf("insert claim: %w", err)
	}
	*in = *got
	return nil
}

// replicas keeps the replicas' own rows in intake_worker: registered,
// retired, and whether one is alive or gone.
type replicas struct{ *core }

// RegisterWorker records that this replica is alive and which partners it
// serves (for partner affinity). It reports whether the worker id's
// previous run ended drained: then no claim of it can be left in
// processing/ without a row. An id with no row is not drained: a one-shot
// run (which never registers) may have claimed under it. It writes only
// while the id's lock is held by holder, this process's lock session's
// backend (ErrWorkerIDNotHeld otherwise): a process that lost the id after
// its last look at its hold must not write its partners and pid into the
// row of the process that took the id.
func (l *replicas) RegisterWorker(ctx context.Context, worker string, partners []string, holder uint32) (drained bool, err error) {
	host, _ := os.Hostname()
	err = l.beat().QueryRow(ctx, `WITH prev AS (SELECT drained_at FROM intake_worker WHERE worker_id = $1)
		INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners)
		SELECT $1::text, $2::text, $3::int4, $4::interval, $5::text[]
		WHERE `+workerLockHeldByBackend("$1", "$6")+`
		ON CONFLICT (worker_id) DO UPDATE SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid,
		    lease = EXCLUDED.lease, partners = EXCLUDED.partners, last_seen = pg_catalog.now(), drained_at = NULL
		RETURNING (SELECT pg_catalog.count(*) > 0 AND pg_catalog.bool_and(drained_at IS NOT NULL) FROM prev)`,
		worker, host, os.Getpid(), l.lease, partners, int64(holder)).Scan(&drained)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrWorkerIDNotHeld
	}
	if err != nil {
		return false, fmt.Errorf("register worker: %w", err)
	}
	return drained, nil
}

// ErrWorkerIDNotHeld: the worker id's lock is not held by this process's
// lock session (RegisterWorker).
var ErrWorkerIDNotHeld = errors.New("register worker: the worker id's lock is not this process's")

// RetireWorker marks a stopping replica gone at once, so the others take
// its partners on their next poll instead of one lease later. drained
// says nothing of this worker id is left without a row on any partner's
// site: every poll ended before the stop, and every partner's
// processing/<worker>/ was looked through (resumeOwn) since the last poll
// that failed, or was known clean from the previous run (Daemon.Stop).
// A run that never reached a partner must not say so: its next start
// would trust it and never look there. A row since
// refreshed by a restarted process of the same id is left alone, and so
// is every row while the id's lock is not held by holder, this process's
// lock session's backend: a process that lost the id after its last look
// at its hold must not retire the row of the process that took the id
// (whose pid may be its own: PID 1 in two containers).
func (l *replicas) RetireWorker(ctx context.Context, worker string, drained bool, holder uint32) error {
	_, err := l.pool.Exec(ctx, `UPDATE intake_worker SET last_seen = pg_catalog.now() - lease - interval '1 second',
		    drained_at = CASE WHEN $3 THEN pg_catalog.now() END
		WHERE worker_id = $1 AND pid = $2
		  AND `+workerLockHeldByBackend("$1", "$4"),
		worker, os.Getpid(), drained, int64(holder))
	return err
}

// WorkerGone reports whether a replica is known to have stopped: its row
// is past its lease or retired. A worker id without a row (a `run --once`,
// which never registers) is not known to be gone: it may be between a
// claim's RENAME and its INSERT right now, so only the reconciler adopts
// from it.
func (l *replicas) WorkerGone(ctx context.Context, worker string) (bool, error) {
	var ok bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM intake_worker
		WHERE worker_id = $1 AND (last_seen <= pg_catalog.now() - lease OR drained_at IS NOT NULL))`, worker).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("worker %s gone: %w", worker, err)
	}
	return ok, nil
}

// leaseStore holds the live rows of file_intake by their leases: which a
// worker holds or may resume, and their heartbeats.
type leaseStore struct{ *core }

// Holding lists the ids of the partner's rows that own a claimed path
// (one of the holding states; live only: one of the live states, a
// worker's under its lease), oldest first, at most limit: of those, the
// rows whose claimed path lies below under (any path when under is "")
// and that worker holds (any worker's when worker is "").
func (l *leaseStore) Holding(ctx context.Context, partner, under, worker string, liveOnly bool, limit int) ([]int64, error) {
	prefix := ""
	if under != "" {
		prefix = strings.TrimSuffix(under, "/") + "/"
	}
	states := holdingStates
	if liveOnly {
		states = liveStates
	}
	rs, err := l.pool.Query(ctx, `SELECT intake_id FROM file_intake
		WHERE partner_id = $1 AND pg_catalog.starts_with(claimed_path, $2::text) AND ($3::text = '' OR worker_id = $3)
		    AND state = ANY($4)
		ORDER BY intake_id LIMIT $5`, partner, prefix, worker, states, limit)
	if err != nil {
		return nil, fmt.Errorf("rows holding a claim: %w", err)
	}
	ids, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("rows holding a claim: %w", err)
	}
	return ids, nil
}

// HeldByGone lists the ids of the partner's rows that own a claimed path
// (the holding states) and whose owner is no live replica: a worker past
// its lease or drained, a one-shot run's id, a released file waiting to
// be taken over; oldest first, at most limit. Only a reconciler or a
// poller of the partner takes them over.
func (l *leaseStore) HeldByGone(ctx context.Context, partner string, limit int) ([]int64, error) {
	rs, err := l.pool.Query(ctx, `SELECT f.intake_id FROM file_intake f
		WHERE f.partner_id = $1 AND f.state = ANY($2)
		  AND NOT EXISTS (SELECT 1 FROM intake_worker w WHERE w.worker_id = f.worker_id
		      AND w.last_seen > pg_catalog.now() - w.lease AND w.drained_at IS NULL)
		ORDER BY f.intake_id LIMIT $3`, partner, holdingStates, limit)
	if err != nil {
		return nil, fmt.Errorf("rows held by gone workers: %w", err)
	}
	ids, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("rows held by gone workers: %w", err)
	}
	return ids, nil
}

// LivePaths reports which of the paths a live row of the partner owns.
func (l *leaseStore) LivePaths(ctx context.Context, partner string, paths []string) (map[string]bool, error) {
	rs, err := l.pool.Query(ctx, `SELECT claimed_path FROM file_intake
		WHERE partner_id = $1 AND claimed_path = ANY($2) AND state = ANY($3)`, partner, paths, holdingStates)
	if err != nil {
		return nil, fmt.Errorf("live paths: %w", err)
	}
	out := map[string]bool{}
	for rs.Next() {
		var p string
		if err := rs.Scan(&p); err != nil {
			rs.Close()
			return nil, fmt.Errorf("live paths: %w", err)
		}
		out[p] = true
	}
	return out, rs.Err()
}

// LiveServing maps each partner to the live replicas that serve it.
func (l *leaseStore) LiveServing(ctx context.Context) (map[string][]string, error) {
	rs, err := l.read.Query(ctx, `SELECT p, pg_catalog.array_agg(worker_id ORDER BY worker_id)
		FROM intake_worker, pg_catalog.unnest(partners) AS p
		WHERE last_seen > pg_catalog.now() - lease GROUP BY p`)
	if err != nil {
		return nil, fmt.Errorf("live replicas: %w", err)
	}
	out := map[string][]string{}
	for rs.Next() {
		var p string
		var ws []string
		if err := rs.Scan(&p, &ws); err != nil {
			rs.Close()
			return nil, fmt.Errorf("live replicas: %w", err)
		}
		out[p] = ws
	}
	return out, rs.Err()
}

// LiveOwnedBy lists the live rows of partner held by worker: after a
// restart the worker resumes them.
func (l *leaseStore) LiveOwnedBy(ctx context.Context, partner, worker string) ([]*Intake, error) {
	rs, err := l.pool.Query(ctx, `SELECT `+intakeColumns+` FROM file_intake
		WHERE partner_id = $1 AND worker_id = $2 AND state = ANY($3) ORDER BY intake_id`,
		partner, worker, liveStates)
	if err != nil {
		return nil, fmt.Errorf("list live intakes: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (*Intake, error) { return scanIntake(r) })
}

// dueOwnedBySQL is DueOwnedBy's statement.
const dueOwnedBySQL = `SELECT ` + intakeColumns + `, state = ANY($3) AND (next_attempt_at IS NULL OR next_attempt_at <= pg_catalog.now())
	FROM file_intake WHERE partner_id = $1 AND worker_id = $2 AND (state = ANY($3) OR state = 'awaiting_approval') ORDER BY intake_id`

// DueOwnedBy lists the live rows of partner held by worker that are due
// (not waiting for the next attempt after a failed run, attempt.go), and
// counts the rows worker holds of partner that are live or wait for a
// decision of ops (awaiting_approval keeps its worker: an approval or
// rejection sends it back to that worker's polls). With none held, a
// poller knows nothing of the partner is its to resume until it claims
// again, or its reconciler takes a file over for it (Daemon.TakenOver).
func (l *leaseStore) DueOwnedBy(ctx context.Context, partner, worker string) (due []*Intake, held int, err error) {
	rs, err := l.pool.Query(ctx, dueOwnedBySQL, partner, worker, liveStates)
	if err != nil {
		return nil, 0, fmt.Errorf("list due intakes: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var isDue bool
		in, err := scanIntake(rs, &isDue)
		if err != nil {
			return nil, 0, fmt.Errorf("list due intakes: %w", err)
		}
		held++
		if isDue {
			due = append(due, in)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, 0, fmt.Errorf("list due intakes: %w", err)
	}
	return due, held, nil
}

// Resume takes a live row this worker id holds (a restarted replica's,
// a file due for its next attempt, one its reconciler took over for it)
// with a new fencing token, so any earlier incarnation's writes are
// refused from now on. A row another worker holds, its lease run out or
// not, is not this worker's to resume: its file is in that worker's
// processing dir, and a takeover (the reconciler's) moves it first.
func (l *leaseStore) Resume(ctx context.Context, id int64, worker string) (*Intake, error) {
	return resume(ctx, l.pool, id, worker, l.lease)
}

// resumeSQL is Resume's statement.
const resumeSQL = `
		UPDATE file_intake SET fencing_token = fencing_token + 1, worker_id = $2,
		       lease_until = pg_catalog.now() + $3::interval, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND state = ANY($4) AND worker_id = $2
		RETURNING `

// resume runs Resume's statement on q.
func resume(ctx context.Context, q Querier, id int64, worker string, lease time.Duration) (*Intake, error) {
	row := q.QueryRow(ctx, resumeSQL+intakeColumns, id, worker, lease, liveStates)
	in, err := scanIntake(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &FencedError{IntakeID: id, Step: "resume"}
	}
	if err != nil {
		return nil, fmt.Errorf("resume intake %d: %w", id, err)
	}
	return in, nil
}

// HeldBy is the pooled worker-id lock a renewal must find still held:
// a one-shot run's, whose hold is not watched (WorkerLock.Pooled).
type HeldBy struct {
	Worker string
	At     Pooled
}

// Renew extends the leases of files still this worker's under their
// fencing tokens, one file or a group's in one statement, and returns the
// ids still held; with held set, only while the pooled lock's backend
// holds the worker id's lock. It goes through the heartbeats' own
// connections, so a full work pool never lets a lease run out.
func (l *leaseStore) Renew(ctx context.Context, ins []*Intake, held *HeldBy) (map[int64]bool, error) {
	return l.renew(ctx, l.beat(), ins, held)
}

func (l *leaseStore) renew(ctx context.Context, q *pgxpool.Pool, ins []*Intake, held *HeldBy) (map[int64]bool, error) {
	ids, tokens := make([]int64, len(ins)), make([]int64, len(ins))
	for i, in := range ins {
		ids[i], tokens[i] = in.ID, in.Token
	}
	var worker *string
	var pid *int64
	var since *time.Time
	if held != nil {
		p := int64(held.At.PID)
		worker, pid, since = &held.Worker, &p, &held.At.Since
	}
	// clock_timestamp: the statement may have waited for the row lock of
	// the file's own long chunk, and the lease counts from now
	rs, err := q.Query(ctx, `UPDATE file_intake f SET lease_until = pg_catalog.clock_timestamp() + $3::interval
		FROM unnest($1::bigint[], $2::bigint[]) AS x(id, token)
		WHERE f.intake_id = x.id AND f.fencing_token = x.token AND f.state = ANY($4)
		  AND ($5::text IS NULL OR (`+workerLockHeldByBackend("$5", "$6")+`
		       AND pg_catalog.pg_postmaster_start_time() = $7))
		RETURNING f.intake_id`, ids, tokens, l.lease, liveStates, worker, pid, since)
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	got, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	out := make(map[int64]bool, len(got))
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}

// Heartbeat is Renew of one file, the fence its run takes before a step;
// a FencedError means the file is lost (or, with held set, the worker
// id's lock is no longer this process's). The run holds no transaction of
// the file then, so the statement waits on no connection of its own
// (core.short: an idle connection of the work pool, which spares a
// one-shot run the heartbeats' pool's first backend, about 30 ms of its
// file, else the heartbeats' pool as Renew); it only extends the lease
// under the token, so it may be made twice.
func (l *leaseStore) Heartbeat(ctx context.Context, in *Intake, held *HeldBy) error {
	var got map[int64]bool
	err := l.short(ctx, func(q *pgxpool.Pool) (err error) {
		got, err = l.renew(ctx, q, []*Intake{in}, held)
		return err
	})
	if err != nil {
		return err
	}
	if !got[in.ID] {
		step := "Heartbeat"
		if held != nil {
			step += " (or the worker id's lock is no longer this process's)"
		}
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: step}
	}
	return nil
}

// setSpooledSQL is SetSpooled's statement: each file claimed -> spooled
// (under its token) and its batch bound to its data hash, answering each
// moved file's batch owner and that owner's hash. A binding made in the
// statement is its own; one an earlier intake made is read from the
// table; one made by an intake that committed after the statement's
// snapshot is neither (NULL: asked again).
const setSpooledSQL = `WITH x AS (
	    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::text[], $9::bigint[])
	        AS x(id, token, sha, size, dsha, dsize, batch, expected)),
	u AS (
	    UPDATE file_intake f
	    SET state = 'spooled', content_sha256 = x.sha, size_bytes = x.size, data_sha256 = x.dsha, data_size = x.dsize,
	        batch_id = x.batch, expected_rows = x.expected, updated_at = pg_catalog.now()
	    FROM x WHERE f.intake_id = x.id AND f.fencing_token = x.token AND f.state = 'claimed'
	    RETURNING f.intake_id, x.dsha, x.batch),
	ins AS (
	    INSERT INTO intake_batch (partner_id, batch_id, content_sha256, intake_id)
	    SELECT $1, batch, dsha, intake_id FROM u
	    ON CONFLICT (partner_id, batch_id) DO NOTHING
	    RETURNING intake_id, batch_id, content_sha256)
	SELECT u.intake_id, coalesce(ins.intake_id, b.intake_id), coalesce(ins.content_sha256, b.content_sha256)
	FROM u LEFT JOIN ins ON ins.batch_id = u.batch
	LEFT JOIN intake_batch b ON b.partner_id = $1 AND b.batch_id = u.batch`

// fileSteps moves one file's row of file_intake through its steps: spooled,
// bound to its intake_batch, applied, outcome unknown, finished, and its
// intake_row_issue rows read back.
type fileSteps struct{ *core }

// Spooled is a file's verified bytes, for SetSpooled: its content's
// sha256 and size, its data's (what its rows are read from: the content
// expanded or decrypted, else the content), its batch and the rows its
// manifest states.
type Spooled struct {
	In           *Intake
	SHA256       string
	Size         int64
	DataSHA256   string
	DataSize     int64
	BatchID      string
	ExpectedRows *int64
}

// SetSpooled records files' verified bytes, one file or a group's in one
// statement: claimed -> spooled, each file's batch bound to its data hash
// (as BindBatch would next: one round trip and one commit less). It
// returns the binding of every file that moved (nil: its batch was bound
// by an intake that committed after the statement's snapshot; BindBatch
// asks again) and sets its fields; a file missing from the map was
// fenced out. The files' partner is one and their batch ids distinct.
func (l *fileSteps) SetSpooled(ctx context.Context, fs []Spooled) (map[int64]*Binding, error) {
	n := len(fs)
	ids, tokens, sizes, dsizes := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	shas, dshas, batches := make([]string, n), make([]string, n), make([]string, n)
	expected := make([]*int64, n)
	byID := make(map[int64]*Spooled, n)
	for i := range fs {
		f := &fs[i]
		ids[i], tokens[i], sizes[i], dsizes[i] = f.In.ID, f.In.Token, f.Size, f.DataSize
		shas[i], dshas[i], batches[i], expected[i] = f.SHA256, f.DataSHA256, f.BatchID, f.ExpectedRows
		byID[f.In.ID] = f
	}
	rs, err := l.pool.Query(ctx, setSpooledSQL, fs[0].In.Partner, ids, tokens, shas, sizes, dshas, dsizes, batches, expected)
	if err != nil {
		return nil, fmt.Errorf("spooled: %w", err)
	}
	out := make(map[int64]*Binding, n)
	for rs.Next() {
		var id int64
		var owner *int64
		var ownerSHA *string
		if err := rs.Scan(&id, &owner, &ownerSHA); err != nil {
			rs.Close()
			return nil, fmt.Errorf("spooled: %w", err)
		}
		f := byID[id]
		if f == nil {
			continue
		}
		in := f.In
		in.State, in.SHA256, in.Size, in.DataSHA256, in.DataSize, in.BatchID, in.ExpectedRows = StateSpooled, f.SHA256, f.Size, f.DataSHA256, f.DataSize, f.BatchID, f.ExpectedRows
		out[id] = nil
		if owner != nil && ownerSHA != nil {
			out[id] = &Binding{Verdict: verdictOf(in, *owner, *ownerSHA), Owner: *owner}
		}
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("spooled: %w", err)
	}
	return out, nil
}

// Binding is a batch binding's outcome for an intake.
type Binding struct {
	Verdict Verdict
	Owner   int64
}

func verdictOf(in *Intake, owner int64, sha string) Verdict {
	switch {
	case owner == in.ID:
		return VerdictNew
	case sha == in.DataSHA256:
		return VerdictDuplicate
	}
	return VerdictConflict
}

// Verdict is what the batch key says about a spooled file.
type Verdict int

// Verdicts.
const (
	VerdictNew       Verdict = iota // this intake owns the batch
	VerdictDuplicate                // the batch is owned with the same bytes
	VerdictConflict                 // the batch is owned with other bytes
)

// BindBatch binds (partner, batch) to this intake's hash, or reports the
// owner. The owner's hash is never updated, so comparing with it is safe.
func (l *fileSteps) BindBatch(ctx context.Context, in *Intake) (Verdict, int64, error) {
	v, owner, err := l.bindBatchOnce(ctx, in)
	var fe *FencedError
	if errors.As(err, &fe) {
		// No row can also mean that another intake's binding committed
		// while the INSERT waited on it: ON CONFLICT then sees it, the
		// statement's snapshot does not. A new statement sees it, or
		// confirms the fence.
		return l.bindBatchOnce(ctx, in)
	}
	return v, owner, err
}

func (l *fileSteps) bindBatchOnce(ctx context.Context, in *Intake) (Verdict, int64, error) {
	var owner int64
	var sha string
	err := l.pool.QueryRow(ctx, `
		WITH ins AS (
		    INSERT INTO intake_batch (partner_id, batch_id, content_sha256, intake_id)
		    SELECT $1, $2, $3, $4
		    WHERE EXISTS (SELECT 1 FROM file_intake WHERE intake_id = $4 AND fencing_token = $5 AND state = 'spooled')
		    ON CONFLICT (partner_id, batch_id) DO NOTHING
		    RETURNING intake_id, content_sha256)
		SELECT intake_id, content_sha256 FROM ins
		UNION ALL
		SELECT intake_id, content_sha256 FROM intake_batch WHERE partner_id = $1 AND batch_id = $2
		LIMIT 1`, in.Partner, in.BatchID, in.DataSHA256, in.ID, in.Token).Scan(&owner, &sha)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, &FencedError{IntakeID: in.ID, Token: in.Token, Step: "bind batch"}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("bind batch: %w", err)
	}
	return verdictOf(in, owner, sha), owner, nil
}

// BatchBound returns the content hash another intake holds the partner's
// batch id under ("" when none does): a file under it can then only end as
// a duplicate or a conflict, never be planned (unless the holder releases
// it meanwhile).
func (l *fileSteps) BatchBound(ctx context.Context, in *Intake, batch string) (string, error) {
	var sha string
	err := l.pool.QueryRow(ctx, `SELECT content_sha256 FROM intake_batch WHERE partner_id = $1 AND batch_id = $2 AND intake_id <> $3`,
		in.Partner, batch, in.ID).Scan(&sha)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return sha, err
}

// BoundFile is the file a (partner, batch) is bound to: the bytes as the
// partner sent them (SHA256, Size) and as applied (DataSHA256, DataSize).
type BoundFile struct {
	Owner      int64
	SHA256     string
	Size       int64
	DataSHA256 string
	DataSize   int64
}

// batchBoundFileSQL is BatchBoundFile's statement.
const batchBoundFileSQL = `SELECT b.intake_id, f.content_sha256, f.size_bytes, b.content_sha256, f.data_size
	FROM intake_batch b JOIN file_intake f ON f.intake_id = b.intake_id
	WHERE b.partner_id = $1 AND b.batch_id = $2 AND b.intake_id <> $3
	  AND f.content_sha256 IS NOT NULL AND f.size_bytes IS NOT NULL
	  AND f.data_sha256 = b.content_sha256 AND f.data_size IS NOT NULL`

// BatchBoundFile reports the file another intake bound the batch to, or
// nil when none did (or its row no longer records the bytes it was sent
// with). One statement; a binding changes only by a release of a batch
// conflict with the new bytes winning (RebindBatch), which moves it to
// that file whole: the answer names the file the binding holds.
func (l *fileSteps) BatchBoundFile(ctx context.Context, in *Intake, batch string) (*BoundFile, error) {
	var b BoundFile
	err := l.pool.QueryRow(ctx, batchBoundFileSQL,
		in.Partner, batch, in.ID).Scan(&b.Owner, &b.SHA256, &b.Size, &b.DataSHA256, &b.DataSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("batch bound file: %w", err)
	}
	return &b, nil
}

// MarkApplied: applying -> applied, only when every row has an outcome.
func (l *fileSteps) MarkApplied(ctx context.Context, in *Intake) error {
	row := l.pool.QueryRow(ctx, `UPDATE file_intake SET state = 'applied', updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applying'
		  AND rows_applied + rows_unchanged + rows_rejected + rows_conflict = rows_total
		RETURNING rows_applied, rows_unchanged, rows_rejected, rows_conflict`, in.ID, in.Token)
	err := row.Scan(&in.RowsApplied, &in.RowsUnchanged, &in.RowsRejected, &in.RowsConflict)
	if errors.Is(err, pgx.ErrNoRows) {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "mark applied (or totals do not reconcile)"}
	}
	if err != nil {
		return fmt.Errorf("mark applied: %w", err)
	}
	in.State = StateApplied
	return nil
}

// MarkUnknown: applying -> outcome_unknown, after a commit without answer.
// The episode counts as an attempt of the file in the same statement
// (attemptSet; lastErr, base and max as RecordAttempt's), so a file whose
// commits go unanswered time after time spends its retry budget: the
// episode that reaches budget attempts, or comes within or more after the
// first failure, is recorded with reason retries_exhausted instead of
// commit_unknown. ResolveUnknown carries that reason back to applying, and
// the run that takes the file up then fails it for good. It returns the
// attempts so far and whether the budget is spent.
//
// A file the lost commit already moved to applied (its last chunk's
// transaction does) is not unknown: the ledger says the commit landed.
// MarkUnknown then reads the row into in (its counts are the ledger's)
// and returns ErrCommitLanded; the run goes on from applied.
func (l *fileSteps) MarkUnknown(ctx context.Context, in *Intake, lastErr string, base, max time.Duration, budget int, within time.Duration) (n int, spent bool, err error) {
	var why string
	err = l.pool.QueryRow(ctx, `UPDATE file_intake SET state = 'outcome_unknown',
		    reason = CASE WHEN attempts + 1 >= $6 OR pg_catalog.now() - coalesce(first_failed_at, pg_catalog.now()) >= $7::interval
		        THEN 'retries_exhausted' ELSE 'commit_unknown' END, `+attemptSet+`
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applying'
		RETURNING attempts, reason`, in.ID, in.Token, base, max, Text(lastErr, 1000), budget, within).Scan(&n, &why)
	if errors.Is(err, pgx.ErrNoRows) {
		landed, lerr := scanIntake(l.pool.QueryRow(ctx, `SELECT `+intakeColumns+` FROM file_intake
			WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applied'`, in.ID, in.Token))
		if lerr == nil {
			*in = *landed
			return 0, false, ErrCommitLanded
		}
		return 0, false, &FencedError{IntakeID: in.ID, Token: in.Token, Step: "mark outcome_unknown"}
	}
	if err != nil {
		return 0, false, fmt.Errorf("mark outcome_unknown: %w", err)
	}
	in.State, in.Reason, in.Attempts = StateOutcomeUnknown, reason.Code(why), n
	return n, in.Reason == reason.RetriesExhausted, nil
}

// Finish moves the file to a terminal or held state after its remote
// housekeeping is done. When the file fails after binding its batch, the
// binding is released in the same transaction so a corrected resend can
// take the batch.
func (l *fileSteps) Finish(ctx context.Context, in *Intake, from, to State, why reason.Code) error {
	if to != StateFailedTerminal && to != StateQuarantined {
		moved, err := l.FinishArchived(ctx, []*Intake{in}, from, to, why)
		if err != nil {
			return err
		}
		if !moved[in.ID] {
			return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "finish as " + string(to)}
		}
		return nil
	}
	if !Allowed(from, to, MoverOwner) {
		return notOwners(in.ID, from, to)
	}
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, finishSQL, finishArgs([]*Intake{in}, from, to, why)...)
		if err := fenced(tag, err, in, "finish as "+string(to)); err != nil {
			return err
		}
		if to == StateFailedTerminal || to == StateQuarantined && why != reason.BatchConflict {
			if _, err := tx.Exec(ctx, `DELETE FROM intake_batch WHERE partner_id = $1 AND batch_id = $2 AND intake_id = $3`,
				in.Partner, in.BatchID, in.ID); err != nil {
				return fmt.Errorf("release batch: %w", err)
			}
		}
		// the quarantine record ops decide on (re-opened, with what the new
		// hold knows of the file, if a released file is held again)
		// a batch conflict records whose binding it met (batch_owner),
		// which a release with the new bytes winning takes the batch from
		if _, err := tx.Exec(ctx, `INSERT INTO intake_quarantine (intake_id, partner_id, reason, batch_id, content_sha256, path, batch_owner)
			VALUES ($1, $2, $3, nullif($4, ''), nullif($5, ''), nullif($6, ''),
			    (SELECT b.intake_id FROM intake_batch b WHERE $7 AND b.partner_id = $2 AND b.batch_id = $4 AND b.intake_id <> $1))
			ON CONFLICT (intake_id) DO UPDATE SET reason = EXCLUDED.reason, path = EXCLUDED.path, held_at = pg_catalog.now(),
			    batch_id = coalesce(EXCLUDED.batch_id, intake_quarantine.batch_id),
			    content_sha256 = coalesce(EXCLUDED.content_sha256, intake_quarantine.content_sha256),
			    batch_owner = EXCLUDED.batch_owner, state = 'open', decided_at = NULL, decided_by = NULL, decision = NULL`,
			in.ID, in.Partner, string(why), in.BatchID, in.SHA256, in.ArchivePath, why == reason.BatchConflict); err != nil {
			return fmt.Errorf("quarantine record: %w", err)
		}
		// the notification, committed with the state change (outbox.go)
		ev := EventQuarantined
		if to == StateFailedTerminal {
			ev = EventFailed
		}
		if _, err := tx.Exec(ctx, fileEventSQL, in.ID, ev); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		in.State, in.Reason = to, why
		return nil
	})
}

// FinishArchived records the end of files archived or duplicate, one
// file's or a group's in one statement (no transaction block): from ->
// to with each file's archive, receipt and rejects paths; a file archived
// with rejected rows has its rejected_rows event written by the same
// statement (outbox.go). It returns the ids that moved, whose state it
// sets; the others were fenced out.
func (l *fileSteps) FinishArchived(ctx context.Context, ins []*Intake, from, to State, why reason.Code) (map[int64]bool, error) {
	if to == StateFailedTerminal || to == StateQuarantined {
		return nil, fmt.Errorf("finish as %s: a held file's end is Finish's", to)
	}
	if !Allowed(from, to, MoverOwner) {
		return nil, notOwners(ins[0].ID, from, to)
	}
	rs, err := l.pool.Query(ctx, finishArchivedSQL, finishArgs(ins, from, to, why)...)
	if err != nil {
		return nil, fmt.Errorf("finish as %s: %w", to, err)
	}
	ids, err := pgx.CollectRows(rs, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("finish as %s: %w", to, err)
	}
	moved := make(map[int64]bool, len(ids))
	for _, id := range ids {
		moved[id] = true
	}
	for _, in := range ins {
		if moved[in.ID] {
			in.State, in.Reason = to, why
		}
	}
	return moved, nil
}

// notOwners refuses a statement the state machine does not take: a
// defect of the caller's, refused before it reaches the database.
func notOwners(id int64, from, to State) error {
	return fmt.Errorf("finish intake %d: %s -> %s is not an owner's transition (states.go)", id, from, to)
}

// finishArgs are finishSQL's arguments for ins.
func finishArgs(ins []*Intake, from, to State, why reason.Code) []any {
	n := len(ins)
	ids, tokens := make([]int64, n), make([]int64, n)
	archives, receipts, rejects, batches := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, in := range ins {
		ids[i], tokens[i] = in.ID, in.Token
		archives[i], receipts[i], rejects[i], batches[i] = in.ArchivePath, in.ReceiptPath, in.RejectsPath, in.BatchID
	}
	return []any{ids, tokens, string(from), string(to), string(why), archives, receipts, rejects, batches}
}

// finishSQL ends files (finishArgs): from $3 to $4 with reason $5 and
// each file's paths. It keeps the batch id the file's reports were named
// after: a file held or decided before its spooled statement recorded it
// has its receipt under that name, and a later decision's receipt (a
// discard, PublishDiscarded) must replace that one, not land beside it.
const finishSQL = `UPDATE file_intake fi
	SET state = $4, reason = nullif($5, ''), archive_path = nullif(x.archive, ''), receipt_path = nullif(x.receipt, ''),
	    rejects_path = nullif(x.rejects, ''), batch_id = coalesce(fi.batch_id, nullif(x.batch, '')),
	    updated_at = pg_catalog.now(), finished_at = pg_catalog.now()
	FROM unnest($1::bigint[], $2::bigint[], $6::text[], $7::text[], $8::text[], $9::text[]) AS x(id, token, archive, receipt, rejects, batch)
	WHERE fi.intake_id = x.id AND fi.fencing_token = x.token AND fi.state = $3`

// IssueRejected is the outcome of a row issue whose row was rejected
// (the other: "conflict", a row held back).
const IssueRejected = "rejected"

// IssueRow is one recorded row issue, for the rejects report.
type IssueRow struct {
	Line    int64
	Column  string
	Reason  reason.Code
	Outcome string
	Detail  string // codes only (SQLSTATE, constraint) for target_refused
}

// IssueCounts is the intake's rows_rejected and rows_conflict as the
// ledger holds them. Every row issue recorded for it is counted in one
// of them in the transaction that records it (the plan's, a chunk's),
// and a plan or a release that clears the issues sets them anew.
func (l *fileSteps) IssueCounts(ctx context.Context, in *Intake) (rejected, conflict int64, err error) {
	err = l.pool.QueryRow(ctx, `SELECT rows_rejected, rows_conflict FROM file_intake WHERE intake_id = $1`, in.ID).Scan(&rejected, &conflict)
	if err != nil {
		return 0, 0, fmt.Errorf("row issue counts: %w", err)
	}
	return rejected, conflict, nil
}

// issues streams the row issues of an intake in line order.
func (l *fileSteps) Issues(ctx context.Context, in *Intake, fn func(IssueRow) error) error {
	rs, err := l.pool.Query(ctx, `SELECT line, coalesce(column_name, ''), reason, outcome, coalesce(detail, '') FROM intake_row_issue
		WHERE intake_id = $1 AND partner_id = $2 ORDER BY line, column_name`, in.ID, in.Partner)
	if err != nil {
		return fmt.Errorf("row issues: %w", err)
	}
	defer rs.Close()
	var r IssueRow
	for rs.Next() {
		if err := rs.Scan(&r.Line, &r.Column, &r.Reason, &r.Outcome, &r.Detail); err != nil {
			return fmt.Errorf("row issues: %w", err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return rs.Err()
}

func fenced(tag pgconn.CommandTag, err error, in *Intake, step string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	if tag.RowsAffected() == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: step}
	}
	return nil
}

// Replayed is an earlier intake of the bytes a replay applies again, and
// when it finished.
type Replayed struct {
	*Intake
	FinishedAt time.Time
}

// ReplayedBefore lists the intakes of the bytes the replay in applies
// again that came before it and applied them: the intake it writes as,
// and that intake's earlier replays, archived and not superseded. Their
// receipts said which rows stood then.
func (l *fileSteps) ReplayedBefore(ctx context.Context, in *Intake) ([]Replayed, error) {
	rs, err := l.pool.Query(ctx, `SELECT `+intakeColumns+`, coalesce(finished_at, updated_at) FROM file_intake
		WHERE partner_id = $1 AND (intake_id = $2 OR replay_of = $2) AND intake_id < $3 AND state = 'archived'
		  AND coalesce(reason, '') <> 'superseded'
		ORDER BY intake_id`, in.Partner, in.ReplayOf, in.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Replayed, error) {
		var e Replayed
		var err error
		e.Intake, err = scanIntake(r, &e.FinishedAt)
		return e, err
	})
}

// RecordReplayedBy records, under the replay's token (its row locked
// against a takeover committing meanwhile), where the earlier intake e's
// receipt naming the replay was published, and that e's rejects report
// is gone.
func (l *fileSteps) RecordReplayedBy(ctx context.Context, e, replay *Intake, receipt string) error {
	tag, err := l.pool.Exec(ctx, `WITH m AS (SELECT 1 FROM file_intake
		    WHERE intake_id = $2 AND fencing_token = $4 AND state = ANY($5) FOR SHARE)
		UPDATE file_intake e SET receipt_path = $3, rejects_path = NULL, updated_at = pg_catalog.now()
		WHERE e.intake_id = $1 AND e.state = 'archived' AND EXISTS (SELECT 1 FROM m)`,
		e.ID, replay.ID, receipt, replay.Token, liveStates)
	if err := fenced(tag, err, replay, "record a replayed intake's receipt"); err != nil {
		return err
	}
	e.ReceiptPath, e.RejectsPath = receipt, ""
	return nil
}
