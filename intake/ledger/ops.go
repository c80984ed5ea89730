package ledger

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/internal/fault"
)

// The statements of ops decisions (release, discard, replay), the
// quarantine records they decide on and the audit trail they leave.

// QuarantineItem is a held file as ops see it.
type QuarantineItem struct {
	IntakeID   int64
	Partner    string
	Reason     reason.Code
	BatchID    string
	SHA256     string
	Path       string
	HeldAt     time.Time
	Hold       string // HoldToken(HeldAt)
	State      string
	DecidedAt  *time.Time
	DecidedBy  string
	Decision   string
	FileName   string
	IntakeStat string
}

// opsDecisions holds the ops views' statements: the quarantine list
// (intake_quarantine), the requests and audit (intake_audit), replays and
// handovers, and settling a request whose reply was lost.
type opsDecisions struct{ *core }

// quarantineItemsSQL selects what a QuarantineItem holds, read by
// scanQuarantineItem; the caller adds its condition.
const quarantineItemsSQL = `SELECT q.intake_id, q.partner_id, q.reason, coalesce(q.batch_id, ''), coalesce(q.content_sha256, ''),
		coalesce(q.path, ''), q.held_at, q.state, q.decided_at, coalesce(q.decided_by, ''), coalesce(q.decision, ''),
		f.remote_name, f.state
		FROM intake_quarantine q JOIN file_intake f USING (intake_id)
		WHERE`

func scanQuarantineItem(r pgx.CollectableRow) (QuarantineItem, error) {
	var q QuarantineItem
	err := r.Scan(&q.IntakeID, &q.Partner, &q.Reason, &q.BatchID, &q.SHA256, &q.Path, &q.HeldAt, &q.State,
		&q.DecidedAt, &q.DecidedBy, &q.Decision, &q.FileName, &q.IntakeStat)
	q.Hold = HoldToken(q.HeldAt)
	return q, err
}

// ListQuarantine lists the held files of the given partners, newest first.
func (l *opsDecisions) ListQuarantine(ctx context.Context, partners []string, openOnly bool) ([]QuarantineItem, error) {
	rs, err := l.pool.Query(ctx, quarantineItemsSQL+` q.partner_id = ANY($1) AND (NOT $2 OR q.state = 'open')
		ORDER BY q.held_at DESC, q.intake_id DESC`, partners, openOnly)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, scanQuarantineItem)
}

// Held is a held file locked for a decision.
type Held struct {
	Partner string
	Reason  reason.Code
	// QState is the quarantine record's state ("open" until decided),
	// FState the file's.
	QState, FState              string
	Feed, BatchID, SHA256, Path string
	Manifest                    string
	// BatchOwner is the intake whose binding of the batch a batch
	// conflict met when it was held (0: not recorded)
	BatchOwner int64
	// Hold is the hold's token (HoldToken)
	Hold string
}

// LockHeld locks a held file of one of partners and its quarantine record
// for a decision in tx; nil when there is none.
func LockHeld(ctx context.Context, tx pgx.Tx, id int64, partners []string) (*Held, error) {
	return held(ctx, tx, id, partners, " FOR UPDATE")
}

// PeekHeld reads a held file of one of partners and its quarantine record
// without a lock (what a decision is planned and audited from, before
// the lock the audit lets it take); nil when there is none.
func PeekHeld(ctx context.Context, tx pgx.Tx, id int64, partners []string) (*Held, error) {
	return held(ctx, tx, id, partners, "")
}

func held(ctx context.Context, tx pgx.Tx, id int64, partners []string, lock string) (*Held, error) {
	var h Held
	var at time.Time
	err := tx.QueryRow(ctx, `SELECT q.partner_id, q.reason, q.state, f.state, f.feed, coalesce(f.batch_id, ''),
		coalesce(f.content_sha256, ''), coalesce(f.archive_path, ''), coalesce(f.manifest_name, ''), coalesce(q.batch_owner, 0), q.held_at
		FROM intake_quarantine q JOIN file_intake f USING (intake_id)
		WHERE q.intake_id = $1 AND q.partner_id = ANY($2)`+lock, id, partners).
		Scan(&h.Partner, &h.Reason, &h.QState, &h.FState, &h.Feed, &h.BatchID, &h.SHA256, &h.Path, &h.Manifest, &h.BatchOwner, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h.Hold = HoldToken(at)
	return &h, nil
}

// HoldToken names one hold of a file: a file held again (its quarantine
// record reopened with a new reason) has a new one. `intake quarantine
// list` and `show` and the console print it; a release or discard names
// the hold it decides on, and is refused when the file was held again
// since (ops.Decision.Hold): nobody decides on a hold they never saw.
func HoldToken(heldAt time.Time) string {
	return strconv.FormatInt(heldAt.UnixMicro(), 36)
}

// RebindBatch binds h's batch to its bytes as applied (the data hash, as
// every binding holds: a compressed or encrypted file's plaintext), for
// a batch conflict released with the new bytes winning. It takes the
// batch only from the intake whose binding the conflict met
// (h.BatchOwner; one not recorded: an intake older than id), and refuses
// when another holds it now: an intake that bound the batch after the
// hold (the first owner gave it back) is not what ops decided against.
// A batch no intake holds is left for the released file to bind when it
// runs.
func RebindBatch(ctx context.Context, tx pgx.Tx, h *Held, id int64) error {
	var holder int64
	err := tx.QueryRow(ctx, `SELECT intake_id FROM intake_batch WHERE partner_id = $1 AND batch_id = $2 FOR UPDATE`,
		h.Partner, h.BatchID).Scan(&holder)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("rebind batch: %w", err)
	case holder == id:
		return nil
	case h.BatchOwner != 0 && holder != h.BatchOwner, h.BatchOwner == 0 && holder > id:
		return fmt.Errorf("%w: batch %s is now bound to intake %d, not the one intake %d was held against; look at intake %d first",
			ErrDecision, h.BatchID, holder, id, holder)
	}
	_, err = tx.Exec(ctx, `UPDATE intake_batch SET intake_id = $3, bound_at = pg_catalog.now(),
		content_sha256 = (SELECT f.data_sha256 FROM file_intake f WHERE f.intake_id = $3)
		WHERE partner_id = $1 AND batch_id = $2`, h.Partner, h.BatchID, id)
	if err != nil {
		return fmt.Errorf("rebind batch: %w", err)
	}
	return nil
}

// Reopen sends a held file back into the pipeline as next with what the
// release overrides, from path (its place in quarantine/) with manifest
// beside it: a new fencing token and an expired lease held by no live
// worker, so a reconciler takes it over. The paths of the reports the
// hold published stay recorded until the next decision replaces them: it
// removes them wherever they are (sitefile.RemoveEarlier). It reports
// false when the file is no longer held.
func Reopen(ctx context.Context, tx pgx.Tx, id int64, next State, override, path, manifest string) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET state = $2, reason = NULL, release_override = nullif($3, ''),
		fencing_token = fencing_token + 1, worker_id = 'released', lease_until = pg_catalog.now() - interval '1 second',
		claimed_path = $4, manifest_name = nullif($5, ''), archive_path = NULL,
		finished_at = NULL, updated_at = pg_catalog.now(),
		rows_applied_earlier = rows_applied_earlier + rows_applied, rows_applied = 0, rows_unchanged = 0, rows_rejected = 0, rows_conflict = 0, rows_deleted = 0, rows_delete_kept = 0, chunks_done = 0, feed_sha256 = NULL,
		plan_hash = NULL, plan_counts = NULL, planned_at = NULL, plan_decision = NULL, approved_plan_hash = NULL,
		attempts = 0, first_failed_at = NULL, next_attempt_at = NULL, last_error = NULL
		WHERE intake_id = $1 AND state IN ('quarantined', 'failed_terminal')`, id, string(next), override, path, manifest)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	// A file that failed part way (retries exhausted after some chunks)
	// starts over as a whole: its chunks apply again (rows it wrote
	// already count as unchanged), so its totals and its rejects report
	// describe one run, and it has a fresh retry budget.
	if _, err := tx.Exec(ctx, `DELETE FROM intake_row_issue WHERE intake_id = $1`, id); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM intake_chunk WHERE intake_id = $1`, id); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM intake_snapshot_key WHERE intake_id = $1`, id); err != nil {
		return false, err
	}
	return true, nil
}

// CloseHeld closes a held file for good under worker. The partner's
// receipt and the reason file still say "held": the same statement takes
// a new fencing token and marks the receipt pending, and the decision is
// published under that token (Undecided). receipt_path keeps naming the
// hold's receipt, wherever the reports dir was then: the publication
// removes it. It reports false when the file is no longer held.
func CloseHeld(ctx context.Context, tx pgx.Tx, id int64, worker string) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET state = 'discarded', fencing_token = fencing_token + 1, worker_id = $2,
		receipt_pending = true, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND state IN ('quarantined', 'failed_terminal')`, id, worker)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// AuditDecision appends the audit row of an ops decision on intake id
// (carrying the command's request id) as its transaction's first write:
// the grants' row-level security lets an ops role change the file's rows
// only after (grants.sql).
func AuditDecision(ctx context.Context, tx pgx.Tx, id int64, partner, request, actor, reason, action, detail string) error {
	return auditRequest(ctx, tx, request, actor, action, partner, id, reason, detail)
}

// MarkDecided records a decision on a quarantine record (qstate: released
// or discarded), audited already in the decision's transaction.
func MarkDecided(ctx context.Context, tx pgx.Tx, id int64, qstate, actor, decision string) error {
	_, err := tx.Exec(ctx, `UPDATE intake_quarantine SET state = $2, decided_at = pg_catalog.now(), decided_by = $3, decision = $4
		WHERE intake_id = $1`, id, qstate, actor, decision)
	return err
}

// audit appends an audit row of an action no ops command asked for by
// request id (the daemon's own, or a command's part that needs none).
func audit(ctx context.Context, tx pgx.Tx, actor, action, partner string, id int64, reason, detail string) error {
	return auditRequest(ctx, tx, "", actor, action, partner, id, reason, detail)
}

// auditRequest appends an audit row; request, when set, is the ops
// command's request id (Requested finds the row by it).
func auditRequest(ctx context.Context, tx pgx.Tx, request, actor, action, partner string, id int64, reason, detail string) error {
	// The session carries the request's name until the transaction ends
	// (set_config local): Settle waits for a commit still in flight.
	_, err := tx.Exec(ctx, `WITH named AS (SELECT pg_catalog.set_config('application_name', $8, true) WHERE $7 <> '')
		INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason, detail, request_id)
		SELECT $1, $2, $3, nullif($4, 0), $5, nullif($6, ''), nullif($7, '') FROM (SELECT 1) one LEFT JOIN named ON true`,
		actor, action, partner, id, reason, detail, request, requestSession(request))
	if err == nil && request != "" {
		// an ops action's audit row, inside its transaction: a step
		// where the transaction is open and its commit not yet sent
		err = fault.Check("ops:before_commit")
	}
	return err
}

// requestSession is the application_name of a session whose transaction
// records request (auditRequest), until that transaction ends.
func requestSession(request string) string { return AppName("request " + request) }

// requestInFlight reports whether a transaction that records request is
// still open: its commit may yet land.
func (l *opsDecisions) requestInFlight(ctx context.Context, request string) (bool, error) {
	var open bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity WHERE application_name = $1
		AND usesysid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = SESSION_USER)
		AND datid = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()))`,
		requestSession(request)).Scan(&open)
	return open, err
}

// Requested finds the audit row of an ops command's request: what it did
// and to which intake. found is false when no such action was recorded:
// its transaction was rolled back, or never reached the database.
func (l *opsDecisions) Requested(ctx context.Context, request string) (action string, intakeID int64, found bool, err error) {
	err = l.pool.QueryRow(ctx, `SELECT action, coalesce(intake_id, 0) FROM intake_audit WHERE request_id = $1`, request).Scan(&action, &intakeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false, nil
	}
	return action, intakeID, err == nil, err
}

// AllPartners is the partner id of an audit row of an action on the
// partners of a configuration together (never a partner's id: names
// rules refuse it).
const AllPartners = "*"

// AuditEntry is one audited ops action.
type AuditEntry struct {
	At                     time.Time
	Actor, Action, Partner string
	IntakeID               int64
	Reason, Detail         string
	// Request is the ops command's request id ("" for the daemon's own).
	Request string
	DBUser  string // the login role that wrote it ("" before it was recorded)
}

// Audit lists the given partners' ops actions, newest first; with
// request set, only the action of that request.
func (l *opsDecisions) Audit(ctx context.Context, partners []string, request string, limit int) ([]AuditEntry, error) {
	rs, err := l.pool.Query(ctx, `SELECT at, actor, action, partner_id, coalesce(intake_id, 0), reason, coalesce(detail, ''), coalesce(request_id, ''), coalesce(db_user, '')
		FROM intake_audit WHERE (partner_id = ANY($1) OR partner_id = '`+AllPartners+`') AND ($3 = '' OR request_id = $3) ORDER BY audit_id DESC LIMIT $2`, partners, limit, request)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		err := r.Scan(&a.At, &a.Actor, &a.Action, &a.Partner, &a.IntakeID, &a.Reason, &a.Detail, &a.Request, &a.DBUser)
		return a, err
	})
}

// BroughtBy returns the intake that brought a duplicate's bytes: the
// latest file of the partner before it, under the same batch with the same
// bytes, that was neither a duplicate nor a replay (the batch's owner when
// the duplicate was judged; a released binding can have let a later file
// of the same bytes own it again). 0 when there is none.
func (l *opsDecisions) BroughtBy(ctx context.Context, dup *Intake) (int64, error) {
	var id int64
	err := l.pool.QueryRow(ctx, `SELECT intake_id FROM file_intake
		WHERE partner_id = $1 AND batch_id = $2 AND intake_id < $3
		  AND state <> 'duplicate' AND replay_of IS NULL
		  AND (coalesce(data_sha256, content_sha256) = $4 OR content_sha256 = $5)
		ORDER BY intake_id DESC LIMIT 1`, dup.Partner, dup.BatchID, dup.ID, dup.DataSHA256, dup.SHA256).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return id, err
}

// InsertReplay records a replay of orig as a new spooled intake of the
// same batch under worker, claimed at path, with its audit row carrying
// the command's request id, in one transaction: the audit row first, with
// the id the row then takes (the ops role may insert a replay only so:
// grants.sql). root is the intake the replay writes as: the intake that
// first brought the bytes (Daemon.Replay picks it). A live replay writing
// as root already is refused with a *LiveReplayError naming it (one live
// replay of the same bytes: the unique index file_intake_one_live_replay).
// handover records the row with its lease already ended: the next
// reconcile run takes it over and a daemon runs it (a replay requested by
// the ops role, which does not run the pipeline).
func (l *opsDecisions) InsertReplay(ctx context.Context, orig *Intake, path, worker string, root int64, override, request, actor, reason string, handover bool) (*Intake, error) {
	lease := l.lease
	if handover {
		lease = -time.Second
	}
	var in *Intake
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `SELECT pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('file_intake', 'intake_id'))`).Scan(&id); err != nil {
			return err
		}
		detail := fmt.Sprintf("replay of intake %d", orig.ID)
		if override != "" {
			detail += " (override " + override + ")"
		}
		if handover {
			detail += ", handed to a daemon"
		}
		if err := auditRequest(ctx, tx, request, actor, "replay", orig.Partner, id, reason, detail); err != nil {
			return err
		}
		row := tx.QueryRow(ctx, `INSERT INTO file_intake (intake_id, partner_id, feed, remote_name, claimed_path, listed_size, batch_id,
			content_sha256, size_bytes, data_sha256, data_size, state, worker_id, lease_until, replay_of, release_override)
			OVERRIDING SYSTEM VALUE
			VALUES ($15, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'spooled', $11, pg_catalog.now() + $12::interval, $13, nullif($14, ''))
			ON CONFLICT (partner_id, replay_of) WHERE replay_of IS NOT NULL
			  AND state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown', 'awaiting_approval') DO NOTHING
			RETURNING `+intakeColumns, orig.Partner, orig.Feed, orig.RemoteName,
			path, orig.Size, orig.BatchID, orig.SHA256, orig.Size,
			orig.DataSHA256, orig.DataSize, worker, lease, root, override, id)
		var err error
		if in, err = scanIntake(row); errors.Is(err, pgx.ErrNoRows) {
			return l.liveReplay(ctx, tx, orig.Partner, root)
		}
		return err
	})
	return in, err
}

// LiveReplayError: a replay was refused because another replay of the
// same bytes is live.
type LiveReplayError struct {
	ID     int64
	State  State
	Worker string
}

func (e *LiveReplayError) Error() string {
	return fmt.Sprintf("a replay of the same bytes is live: intake %d (state %s, worker %s); %s", e.ID, e.State, e.Worker, e.State.Info().Fate)
}

// liveReplay is the error naming the live replay writing as root.
func (l *opsDecisions) liveReplay(ctx context.Context, tx pgx.Tx, partner string, root int64) error {
	e := &LiveReplayError{}
	err := tx.QueryRow(ctx, `SELECT intake_id, state, worker_id FROM file_intake
		WHERE partner_id = $1 AND replay_of = $2 AND state = ANY($3)`, partner, root, holdingStates).Scan(&e.ID, &e.State, &e.Worker)
	if err != nil {
		return fmt.Errorf("replay refused as live, and the live one not found: %w", err)
	}
	return e
}

// Handover ends the lease of a live row an ops command holds and gives up
// (its database went away mid-run, say), under the command's fencing
// token: the next reconcile run takes it over rather than waiting for the
// lease to run out. false when the row moved on meanwhile.
func (l *opsDecisions) Handover(ctx context.Context, in *Intake) (bool, error) {
	tag, err := l.pool.Exec(ctx, `UPDATE file_intake SET lease_until = pg_catalog.now() - interval '1 second', updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND worker_id = $3 AND state = ANY($4)`, in.ID, in.Token, in.Worker, liveStates)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// Undecided lists the partner's discarded files whose decision is not yet
// published to the partner (PublishDiscarded): marked pending, or with no
// receipt recorded (how an older intake binary, still running beside this
// one during an upgrade, marks a discard).
func (l *opsDecisions) Undecided(ctx context.Context, partner string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND state = 'discarded' AND (receipt_pending OR receipt_path IS NULL)`, partner)
}

// StillDiscarded confirms that a discard's token is still current, before
// a step of its publication.
func (l *opsDecisions) StillDiscarded(ctx context.Context, in *Intake) error {
	tag, err := l.pool.Exec(ctx, `UPDATE file_intake SET updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'discarded'`, in.ID, in.Token)
	return fenced(tag, err, in, "publish discard")
}

// RecordDiscardReceipt records where a discard's receipt was published,
// under the discard's token.
func (l *opsDecisions) RecordDiscardReceipt(ctx context.Context, in *Intake, path string) error {
	tag, err := l.pool.Exec(ctx, `UPDATE file_intake SET receipt_path = $3, receipt_pending = false, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'discarded'`, in.ID, in.Token, path)
	if err := fenced(tag, err, in, "record discard receipt"); err != nil {
		return err
	}
	in.ReceiptPath, in.ReceiptPending = path, false
	return nil
}
