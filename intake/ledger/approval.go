package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
)

// The statements of plans and approval (migration 011).
// A file of a feed with an approval policy is planned against its target;
// its plan (counts, hash) is stored with it by RecordPlan in the plan's
// transaction, and, while it waits, every change (intake_plan_change,
// migration 021, written by the target's plan); a decision removes the
// changes. A file that needs a decision is
// moved to awaiting_approval by the plan statement itself (Plan): no
// lease, no worker. Approve and Reject are each one conditional statement
// on (intake, state awaiting_approval[, plan hash]) with their audit row
// in the same transaction: of two decisions racing, exactly one finds the
// row still waiting. Each sends the file back to spooled with a new
// fencing token and an expired lease, so its owner's next poll (or the
// partner's poller, Decided, or a reconciler's takeover) runs it: an approved file is
// planned again and applied only when the fresh plan has the approved
// hash; a rejected one is quarantined (plan_rejected).

// PlanRecord is a file's plan as stored.
type PlanRecord struct {
	Hash   string
	Counts json.RawMessage // the counts (target.PlanCounts as JSON)
	// Wait: the plan needs a decision (the file moves to
	// awaiting_approval); Why says which threshold (no values).
	Wait bool
	Why  string
	// Replanned: the file was approved under another hash and the fresh
	// plan differs (audited as replan, reason plan_changed).
	Replanned   bool
	ApprovedWas string
}

// RecordPlan stores the plan of a file just planned in tx (after Plan
// moved it on, under its token) and, when the file waits, writes its
// awaiting_approval event and, for a re-plan of an approved file, the
// audit row. The approved hash stays as it was: the file is applied only
// if a later plan has it.
func RecordPlan(ctx context.Context, tx pgx.Tx, in *Intake, p PlanRecord) error {
	why := ""
	if p.Wait {
		why = string(reason.AwaitingApproval)
		if p.Replanned {
			why = string(reason.PlanChanged)
		}
	}
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET plan_hash = $3, plan_counts = $4, planned_at = pg_catalog.now(),
		    plan_decision = NULL, reason = nullif($5, ''), updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2`, in.ID, in.Token, p.Hash, p.Counts, why)
	if err := fenced(tag, err, in, "record plan"); err != nil {
		return err
	}
	in.PlanHash, in.PlanDecision = p.Hash, ""
	// an earlier plan's changes go; a plan that waits has its own
	// recorded next, in tx (target.Table.RecordChanges)
	if _, err := tx.Exec(ctx, deleteChanges, in.ID); err != nil {
		return fmt.Errorf("earlier plan's changes: %w", err)
	}
	if !p.Wait {
		return nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO intake_outbox (partner_id, event, payload)
		SELECT f.partner_id, $2, `+filePayload+` || pg_catalog.jsonb_build_object('plan_hash', f.plan_hash) FROM file_intake f WHERE f.intake_id = $1`,
		in.ID, EventAwaitingApproval); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if p.Replanned {
		return audit(ctx, tx, "intake", "replan", in.Partner, in.ID, string(reason.PlanChanged),
			fmt.Sprintf("approved plan %s no longer holds; new plan %s awaits approval", p.ApprovedWas, p.Hash))
	}
	return audit(ctx, tx, "intake", "await_approval", in.Partner, in.ID, string(reason.AwaitingApproval),
		fmt.Sprintf("plan %s: %s", p.Hash, p.Why))
}

// deleteChanges removes the plan changes of intake $1 (migration 021).
const deleteChanges = `WITH c AS (DELETE FROM intake_plan_change WHERE intake_id = $1)
	DELETE FROM intake_plan_change_column WHERE intake_id = $1`

// ErrPlanDecision: an approve or reject that cannot be made; the message
// says why.
var ErrPlanDecision = errors.New("plan decision refused")

// PlanView is a file's plan as `intake plan show` shows it.
type PlanView struct {
	IntakeID                int64
	Partner, Feed, File     string
	State, Reason           string
	ContentSHA256, FeedSHA  string
	Hash, ApprovedHash      string
	Decision                string
	Counts                  json.RawMessage
	PlannedAt               *time.Time
	RowsTotal, RowsRejected int64
}

// approvals reads the plans stored with a file in file_intake and decides
// them: approve and reject with their intake_audit rows, and the files
// awaiting approval.
type approvals struct{ *core }

// GetPlan reads the plan of a file of one of partners, its hash and
// counts (its changes are PlanChangePage's); nil when there is no such
// file.
func (l *approvals) GetPlan(ctx context.Context, id int64, partners []string) (*PlanView, error) {
	var v PlanView
	err := l.read.QueryRow(ctx, `SELECT intake_id, partner_id, feed, remote_name, state, coalesce(reason, ''),
		    coalesce(content_sha256, ''), coalesce(feed_sha256, ''), coalesce(plan_hash, ''), coalesce(approved_plan_hash, ''),
		    coalesce(plan_decision, ''), plan_counts, planned_at, coalesce(rows_total, 0), rows_rejected
		FROM file_intake WHERE intake_id = $1 AND partner_id = ANY($2)`, id, partners).Scan(
		&v.IntakeID, &v.Partner, &v.Feed, &v.File, &v.State, &v.Reason, &v.ContentSHA256, &v.FeedSHA, &v.Hash,
		&v.ApprovedHash, &v.Decision, &v.Counts, &v.PlannedAt, &v.RowsTotal, &v.RowsRejected)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("plan of intake %d: %w", id, err)
	}
	return &v, nil
}

// PlanDecision is an ops decision on a waiting plan.
type PlanDecision struct {
	IntakeID int64
	// Partners the actor's configuration covers.
	Partners      []string
	Actor, Reason string
	// PlanHash: the hash the actor approves (approve only).
	PlanHash string
	// SnapshotFeeds: the "partner/feed" of every snapshot feed the
	// actor's configuration covers; an approval of a file of one of them
	// that a newer applied snapshot supersedes is refused.
	SnapshotFeeds []string
	// Request is the command's request id, recorded on the audit row.
	Request string

	// FourEyes refuses an approval by whoever released or requested the file (sameHands).
	FourEyes bool
	// SharedLogin: the database login is shared by several people (the
	// console's, which is the daemon's), so Actor is who decides, as the
	// caller authenticated them, and four eyes compares actors, not logins.
	SharedLogin bool
}

// Approve approves a waiting file's plan, when hash is its current plan
// hash: awaiting_approval -> spooled with plan_decision approved and the
// hash recorded, a new fencing token and an expired lease; audited in the
// same transaction. Of racing decisions exactly one succeeds. A decision
// starts the file's retry budget afresh, as a release does.
func (l *approvals) Approve(ctx context.Context, d PlanDecision) error {
	return l.decidePlan(ctx, d, "approved")
}

// Reject rejects a waiting file's plan: awaiting_approval -> spooled with
// plan_decision rejected (its next run quarantines it, plan_rejected);
// audited in the same transaction.
func (l *approvals) Reject(ctx context.Context, d PlanDecision) error {
	return l.decidePlan(ctx, d, "rejected")
}

func (l *approvals) decidePlan(ctx context.Context, d PlanDecision, decision string) error {
	if d.Actor == "" || d.Reason == "" {
		return fmt.Errorf("%w: an actor and a reason are required", ErrPlanDecision)
	}
	if decision == "approved" && d.PlanHash == "" {
		return fmt.Errorf("%w: --plan-hash is required (intake plan show %d prints it)", ErrPlanDecision, d.IntakeID)
	}
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := sameHands(ctx, tx, d, decision); err != nil {
			return err
		}
		// the audit row first: the grants' row-level security lets an ops
		// role change the file only once its decision is audited
		// (grants.sql); the plan audited is the one the statement decides
		action := "approve"
		if decision == "rejected" {
			action = "reject"
		}
		var partner, audited string
		err := tx.QueryRow(ctx, `SELECT partner_id, coalesce(plan_hash, '') FROM file_intake WHERE intake_id = $1 AND partner_id = ANY($2)`,
			d.IntakeID, d.Partners).Scan(&partner, &audited)
		if errors.Is(err, pgx.ErrNoRows) {
			return l.whyNotDecided(ctx, tx, d)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", decision, err)
		}
		if err := auditRequest(ctx, tx, d.Request, d.Actor, action, partner, d.IntakeID, d.Reason, "plan "+audited); err != nil {
			return err
		}
		var hash string
		err = tx.QueryRow(ctx, `UPDATE file_intake SET state = 'spooled', reason = NULL, plan_decision = $3,
		        approved_plan_hash = CASE WHEN $3 = 'approved' THEN plan_hash ELSE approved_plan_hash END,
		        fencing_token = fencing_token + 1, lease_until = pg_catalog.now() - interval '1 second',
		        attempts = 0, first_failed_at = NULL, next_attempt_at = NULL, last_error = NULL, updated_at = pg_catalog.now()
		    WHERE intake_id = $1 AND partner_id = ANY($2) AND state = 'awaiting_approval'
		      AND ($3 = 'rejected' AND ($4 = '' OR plan_hash = $4) OR (plan_hash = $4 AND NOT (coalesce(partner_id || '/' || feed = ANY($5::text[]), false) AND `+newerSnapshot+`)))
		    RETURNING coalesce(plan_hash, '')`, d.IntakeID, d.Partners, decision, d.PlanHash, d.SnapshotFeeds).Scan(&hash)
		if errors.Is(err, pgx.ErrNoRows) {
			return l.whyNotDecided(ctx, tx, d)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", decision, err)
		}
		if hash != audited {
			return fmt.Errorf("%w: the plan of intake %d changed while it was being decided; review it again with intake plan show %d", ErrPlanDecision, d.IntakeID, d.IntakeID)
		}
		// the plan's changes go with its sample: their values were kept
		// for this decision
		if _, err := tx.Exec(ctx, deleteChanges, d.IntakeID); err != nil {
			return fmt.Errorf("%s: the plan's changes: %w", decision, err)
		}
		return nil
	})
}

// whyNotDecided explains a decision that found no waiting row.
func (l *approvals) whyNotDecided(ctx context.Context, tx pgx.Tx, d PlanDecision) error {
	var state, hash string
	var superseded bool
	err := tx.QueryRow(ctx, `SELECT state, coalesce(plan_hash, ''), coalesce(partner_id || '/' || feed = ANY($3::text[]), false) AND `+newerSnapshot+`
		FROM file_intake WHERE intake_id = $1 AND partner_id = ANY($2)`,
		d.IntakeID, d.Partners, d.SnapshotFeeds).Scan(&state, &hash, &superseded)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: no intake %d among the configured partners", ErrPlanDecision, d.IntakeID)
	case err != nil:
		return err
	case state != string(StateAwaitingApproval):
		return fmt.Errorf("%w: intake %d is not awaiting approval (state %s)", ErrPlanDecision, d.IntakeID, state)
	case superseded && hash == d.PlanHash:
		return fmt.Errorf("%w: intake %d is a snapshot older than one its feed has applied since: applied now it would undo the newer one (its next run archives it as superseded)", ErrPlanDecision, d.IntakeID)
	}
	return fmt.Errorf("%w: plan hash %s is not the current plan of intake %d (its plan is %s: the plan changed or the hash is mistyped; review it with intake plan show %d)",
		ErrPlanDecision, d.PlanHash, d.IntakeID, hash, d.IntakeID)
}

// newerSnapshot is true in a statement on file_intake when a newer file
// of the row's feed holds rows (SupersededBy's condition, for the row's
// own place).
var newerSnapshot = `EXISTS (SELECT 1 FROM file_intake n WHERE ` +
	newerSnapshotOf("file_intake.partner_id", "file_intake.feed", "coalesce(file_intake.replay_of, file_intake.intake_id)") + `)`

// Waiting is a file awaiting approval, for `intake status`.
type Waiting struct {
	Partner   string
	IntakeID  int64
	Feed      string
	Reason    string
	PlanHash  string
	PlannedAt time.Time
}

// AwaitingApproval lists the partners' files awaiting approval, oldest
// plan first.
func (l *approvals) AwaitingApproval(ctx context.Context, partners []string) ([]Waiting, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, intake_id, feed, coalesce(reason, ''), coalesce(plan_hash, ''), coalesce(planned_at, updated_at)
		FROM file_intake WHERE partner_id = ANY($1) AND state = 'awaiting_approval' ORDER BY planned_at, intake_id`, partners)
	if err != nil {
		return nil, fmt.Errorf("awaiting approval: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Waiting, error) {
		var w Waiting
		return w, r.Scan(&w.Partner, &w.IntakeID, &w.Feed, &w.Reason, &w.PlanHash, &w.PlannedAt)
	})
}

// Rewait moves a file whose first chunk found its approved plan changed
// back to awaiting_approval (applying -> awaiting_approval, fenced, only
// while no chunk is applied), in tx with RecordPlan.
func Rewait(ctx context.Context, tx pgx.Tx, in *Intake) error {
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET state = 'awaiting_approval', updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applying' AND chunks_done = 0`, in.ID, in.Token)
	if err := fenced(tag, err, in, "back to awaiting_approval"); err != nil {
		return err
	}
	in.State = StateAwaitingApproval
	return nil
}

// Decided lists the partner's files that ops decided (approve or reject)
// and that no worker has resumed yet (their lease expired with the
// decision), held by a worker other than worker: the partner's poller
// takes them over (ClaimLock.TakeOver) and runs them.
func (l *approvals) Decided(ctx context.Context, partner, worker string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1 AND state = 'spooled' AND plan_decision IS NOT NULL
		AND lease_until < pg_catalog.now() AND worker_id <> $2`, partner, worker)
}
