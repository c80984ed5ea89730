package ops

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/partners"
)

// Winners of a batch conflict.
const (
	WinnerNew = "new" // the held (newer) bytes win: they are applied over the batch
	WinnerOld = "old" // the earlier bytes stay: the held file is discarded
)

// QuarantineItem is a held file as ops see it.
type QuarantineItem struct {
	IntakeID   int64
	Partner    string
	Reason     string
	BatchID    string
	SHA256     string
	Path       string
	HeldAt     time.Time
	State      string
	DecidedAt  *time.Time
	DecidedBy  string
	Decision   string
	FileName   string
	IntakeStat string
}

// ListQuarantine lists the held files of the given partners, newest first.
func ListQuarantine(ctx context.Context, db *pgxpool.Pool, partners []string, openOnly bool) ([]QuarantineItem, error) {
	rs, err := db.Query(ctx, `SELECT q.intake_id, q.partner_id, q.reason, coalesce(q.batch_id, ''), coalesce(q.content_sha256, ''),
		coalesce(q.path, ''), q.held_at, q.state, q.decided_at, coalesce(q.decided_by, ''), coalesce(q.decision, ''),
		f.remote_name, f.state
		FROM intake_quarantine q JOIN file_intake f USING (intake_id)
		WHERE q.partner_id = ANY($1) AND (NOT $2 OR q.state = 'open')
		ORDER BY q.held_at DESC, q.intake_id DESC`, partners, openOnly)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (QuarantineItem, error) {
		var q QuarantineItem
		err := r.Scan(&q.IntakeID, &q.Partner, &q.Reason, &q.BatchID, &q.SHA256, &q.Path, &q.HeldAt, &q.State,
			&q.DecidedAt, &q.DecidedBy, &q.Decision, &q.FileName, &q.IntakeStat)
		return q, err
	})
}

// Decision is an ops action on a held file.
type Decision struct {
	IntakeID int64
	Actor    string
	Reason   string
	// Winner is required to release a batch conflict: WinnerNew or WinnerOld.
	Winner string
	// Partners the actor's configuration covers: a decision on another
	// partner's file is refused as if the file did not exist.
	Partners []string
	// Worker is the ops identity (OpsWorker) recorded as the row's worker.
	Worker string
}

func (d Decision) check() error {
	if d.Actor == "" || d.Reason == "" {
		return fmt.Errorf("%w: an actor and a reason are required", ErrDecision)
	}
	return nil
}

// Release sends a held file back into the pipeline with what the decision
// overrides, in one transaction with its audit row. The file stays in
// quarantine/ with an expired lease held by no live worker, so a
// reconciler takes it over into its processing/ dir and that daemon
// finishes it (within one reconcile interval). Releasing a batch conflict
// needs a winner: "new" rebinds the batch to the held bytes, which are then
// applied over the earlier ones; "old" discards the held file.
func Release(ctx context.Context, db *pgxpool.Pool, d Decision) error {
	if err := d.check(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var partner, reason, qstate, fstate, feed, batch, sha, held, manifest string
		err := tx.QueryRow(ctx, `SELECT q.partner_id, q.reason, q.state, f.state, f.feed, coalesce(f.batch_id, ''),
			coalesce(f.content_sha256, ''), coalesce(f.archive_path, ''), coalesce(f.manifest_name, '')
			FROM intake_quarantine q JOIN file_intake f USING (intake_id)
			WHERE q.intake_id = $1 AND q.partner_id = ANY($2) FOR UPDATE`, d.IntakeID, d.Partners).
			Scan(&partner, &reason, &qstate, &fstate, &feed, &batch, &sha, &held, &manifest)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: intake %d is not held", ErrDecision, d.IntakeID)
		}
		if err != nil {
			return err
		}
		if qstate != "open" {
			return fmt.Errorf("%w: intake %d was already %s", ErrDecision, d.IntakeID, qstate)
		}
		override := ""
		switch {
		case feed == NoFeed:
			return fmt.Errorf("%w: intake %d is a hostile entry (%s): it can only be discarded", ErrDecision, d.IntakeID, reason)
		case reason == ReasonBadBatchID:
			return fmt.Errorf("%w: intake %d has no usable batch id: it can only be discarded", ErrDecision, d.IntakeID)
		case reason == ReasonBatchConflict:
			switch d.Winner {
			case WinnerOld:
				return discard(ctx, tx, d, partner, "release_conflict_old_wins")
			case WinnerNew:
				override = OverrideConflictNewWin
				if _, err := tx.Exec(ctx, `UPDATE intake_batch SET intake_id = $3, content_sha256 = $4, bound_at = now()
					WHERE partner_id = $1 AND batch_id = $2`, partner, batch, d.IntakeID, sha); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%w: releasing a batch conflict needs --winner new or --winner old", ErrDecision)
			}
		case reason == ReasonRejectRate:
			override = OverrideRejectRate
		case reason == ReasonManifestMismatch:
			override = OverrideManifest
		case reason == ReasonFileTooLarge:
			override = OverrideSize
		}
		if override == "" {
			override = OverrideNothing
		}
		next := StateSpooled
		if sha == "" {
			next = StateClaimed
		}
		if manifest != "" && held != "" {
			manifest = path.Base(held) + ManifestSuffix // held beside the data file
		}
		tag, err := tx.Exec(ctx, `UPDATE file_intake SET state = $2, reason = NULL, release_override = nullif($3, ''),
			fencing_token = fencing_token + 1, worker_id = 'released', lease_until = now() - interval '1 second',
			claimed_path = $4, manifest_name = nullif($5, ''), archive_path = NULL, receipt_path = NULL, rejects_path = NULL,
			finished_at = NULL, updated_at = now(),
			rows_applied = 0, rows_unchanged = 0, rows_rejected = 0, rows_conflict = 0, chunks_done = 0,
			attempts = 0, first_failed_at = NULL, next_attempt_at = NULL, last_error = NULL
			WHERE intake_id = $1 AND state IN ('quarantined', 'failed_terminal')`, d.IntakeID, string(next), override, held, manifest)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: intake %d is in state %s", ErrDecision, d.IntakeID, fstate)
		}
		// A file that failed part way (retries exhausted after some chunks)
		// starts over as a whole: its chunks apply again (rows it wrote
		// already count as unchanged), so its totals and its rejects report
		// describe one run, and it has a fresh retry budget.
		if _, err := tx.Exec(ctx, `DELETE FROM intake_row_issue WHERE intake_id = $1`, d.IntakeID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM intake_chunk WHERE intake_id = $1`, d.IntakeID); err != nil {
			return err
		}
		return decide(ctx, tx, d, partner, "released", "release", fmt.Sprintf("reason %s, override %q, resumes as %s", reason, override, next))
	})
}

// Discard closes a held file for good; it stays in quarantine/ as evidence
// until retention removes it.
func Discard(ctx context.Context, db *pgxpool.Pool, d Decision) error {
	if err := d.check(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var partner, qstate string
		err := tx.QueryRow(ctx, `SELECT partner_id, state FROM intake_quarantine WHERE intake_id = $1 AND partner_id = ANY($2) FOR UPDATE`,
			d.IntakeID, d.Partners).Scan(&partner, &qstate)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: intake %d is not held", ErrDecision, d.IntakeID)
		}
		if err != nil {
			return err
		}
		if qstate != "open" {
			return fmt.Errorf("%w: intake %d was already %s", ErrDecision, d.IntakeID, qstate)
		}
		return discard(ctx, tx, d, partner, "discard")
	})
}

// discard closes a held file. The partner's receipt and the reason file
// still say "held": the same statement takes a new fencing token and
// clears receipt_path, and PublishDiscarded (run by the command right after,
// or by the reconciler when that failed) publishes the decision under that
// token.
func discard(ctx context.Context, tx pgx.Tx, d Decision, partner, action string) error {
	worker := d.Worker
	if worker == "" {
		worker = "discarded"
	}
	tag, err := tx.Exec(ctx, `UPDATE file_intake SET state = 'discarded', fencing_token = fencing_token + 1, worker_id = $2,
		receipt_path = NULL, updated_at = now()
		WHERE intake_id = $1 AND state IN ('quarantined', 'failed_terminal')`, d.IntakeID, worker)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: intake %d is not held", ErrDecision, d.IntakeID)
	}
	return decide(ctx, tx, d, partner, "discarded", action, "")
}

// PublishDecision publishes what a decision on intake id means to its
// partner, where the decision itself does not: a discarded file's receipt
// and reason file (a released file's are published by the daemon that
// finishes it). The partner's site is dialled with its entry of parts.
func PublishDecision(ctx context.Context, db *pgxpool.Pool, parts []partners.Config, id int64) error {
	l := NewLedger(db, DefaultLease)
	for i := range parts {
		in, err := l.Get(ctx, parts[i].ID, id)
		if err != nil {
			return err
		}
		if in == nil || in.State != StateDiscarded || in.ReceiptPath != "" {
			continue
		}
		s, err := partners.Dial(ctx, &parts[i])
		if err != nil {
			return err
		}
		defer s.Close()
		return l.PublishDiscarded(ctx, s, in)
	}
	return nil
}

func decide(ctx context.Context, tx pgx.Tx, d Decision, partner, qstate, action, detail string) error {
	if _, err := tx.Exec(ctx, `UPDATE intake_quarantine SET state = $2, decided_at = now(), decided_by = $3, decision = $4
		WHERE intake_id = $1`, d.IntakeID, qstate, d.Actor, d.Reason); err != nil {
		return err
	}
	return audit(ctx, tx, d.Actor, action, partner, d.IntakeID, d.Reason, detail)
}

func audit(ctx context.Context, tx pgx.Tx, actor, action, partner string, id int64, reason, detail string) error {
	q := tx
	_, err := q.Exec(ctx, `INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason, detail)
		VALUES ($1, $2, $3, nullif($4, 0), $5, nullif($6, ''))`, actor, action, partner, id, reason, detail)
	return err
}

// AuditEntry is one audited ops action.
type AuditEntry struct {
	At                     time.Time
	Actor, Action, Partner string
	IntakeID               int64
	Reason, Detail         string
}

// Audit lists the given partners' ops actions, newest first.
func Audit(ctx context.Context, db *pgxpool.Pool, partners []string, limit int) ([]AuditEntry, error) {
	rs, err := db.Query(ctx, `SELECT at, actor, action, partner_id, coalesce(intake_id, 0), reason, coalesce(detail, '')
		FROM intake_audit WHERE partner_id = ANY($1) ORDER BY audit_id DESC LIMIT $2`, partners, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		err := r.Scan(&a.At, &a.Actor, &a.Action, &a.Partner, &a.IntakeID, &a.Reason, &a.Detail)
		return a, err
	})
}
