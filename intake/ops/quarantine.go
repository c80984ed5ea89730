package ops

import (
	"context"
	"fmt"
	"path"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
)

// Winners of a batch conflict.
const (
	WinnerNew = "new" // the held (newer) bytes win: they are applied over the batch
	WinnerOld = "old" // the earlier bytes stay: the held file is discarded
)

// QuarantineItem is a held file as ops see it.
type QuarantineItem = ledger.QuarantineItem

// ListQuarantine lists the held files of the given partners, newest first.
func ListQuarantine(ctx context.Context, db *pgxpool.Pool, partners []string, openOnly bool) ([]QuarantineItem, error) {
	return ledgerOn(db).ListQuarantine(ctx, partners, openOnly)
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
	// Request is the command's request id, recorded on the audit row: a
	// command that lost its database mid-decision learns from it whether
	// the decision was recorded (ledger.Requested).
	Request string
}

func (d Decision) check() error {
	if d.Actor == "" || d.Reason == "" {
		return fmt.Errorf("%w: an actor and a reason are required", intake.ErrDecision)
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
		h, err := ledger.LockHeld(ctx, tx, d.IntakeID, d.Partners)
		if err != nil {
			return err
		}
		if h == nil {
			return fmt.Errorf("%w: intake %d is not held", intake.ErrDecision, d.IntakeID)
		}
		manifest := h.Manifest
		if h.QState != "open" {
			return fmt.Errorf("%w: intake %d was already %s", intake.ErrDecision, d.IntakeID, h.QState)
		}
		override := ""
		switch {
		case h.Feed == intake.NoFeed:
			return fmt.Errorf("%w: intake %d is a hostile entry (%s): it can only be discarded", intake.ErrDecision, d.IntakeID, h.Reason)
		case h.Reason == intake.ReasonNotRegular:
			return fmt.Errorf("%w: intake %d was not a regular file when claimed (%s): it can only be discarded", intake.ErrDecision, d.IntakeID, h.Reason)
		case h.Reason == intake.ReasonBadBatchID:
			return fmt.Errorf("%w: intake %d has no usable batch id: it can only be discarded", intake.ErrDecision, d.IntakeID)
		case h.Reason == intake.ReasonBatchConflict:
			switch d.Winner {
			case WinnerOld:
				return discard(ctx, tx, d, h.Partner, "release_conflict_old_wins")
			case WinnerNew:
				override = intake.OverrideConflictNewWin
				if err := ledger.RebindBatch(ctx, tx, h.Partner, h.BatchID, d.IntakeID, h.SHA256); err != nil {
					return err
				}
			default:
				return fmt.Errorf("%w: releasing a batch conflict needs --winner new or --winner old", intake.ErrDecision)
			}
		case h.Reason == intake.ReasonRejectRate:
			override = intake.OverrideRejectRate
		case h.Reason == intake.ReasonManifestMismatch:
			override = intake.OverrideManifest
		case h.Reason == intake.ReasonFileTooLarge:
			override = intake.OverrideSize
		}
		if override == "" {
			override = intake.OverrideNothing
		}
		next := intake.StateSpooled
		if h.SHA256 == "" {
			next = intake.StateClaimed
		}
		if manifest != "" && h.Path != "" {
			manifest = path.Base(h.Path) + partners.ManifestSuffix // held beside the data file
		}
		reopened, err := ledger.Reopen(ctx, tx, d.IntakeID, next, override, h.Path, manifest)
		if err != nil {
			return err
		}
		if !reopened {
			return fmt.Errorf("%w: intake %d is in state %s", intake.ErrDecision, d.IntakeID, h.FState)
		}
		return decide(ctx, tx, d, h.Partner, "released", "release", fmt.Sprintf("reason %s, override %q, resumes as %s", h.Reason, override, next))
	})
}

// Discard closes a held file for good; it stays in quarantine/ as evidence
// until retention removes it.
func Discard(ctx context.Context, db *pgxpool.Pool, d Decision) error {
	if err := d.check(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		partner, qstate, ok, err := ledger.LockQuarantine(ctx, tx, d.IntakeID, d.Partners)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: intake %d is not held", intake.ErrDecision, d.IntakeID)
		}
		if qstate != "open" {
			return fmt.Errorf("%w: intake %d was already %s", intake.ErrDecision, d.IntakeID, qstate)
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
	closed, err := ledger.CloseHeld(ctx, tx, d.IntakeID, worker)
	if err != nil {
		return err
	}
	if !closed {
		return fmt.Errorf("%w: intake %d is not held", intake.ErrDecision, d.IntakeID)
	}
	return decide(ctx, tx, d, partner, "discarded", action, "")
}

// PublishDecision publishes what a decision on intake id means to its
// partner, where the decision itself does not: a discarded file's receipt
// and reason file (a released file's are published by the daemon that
// finishes it). The partner's site is dialled with its entry of parts.
func PublishDecision(ctx context.Context, db *pgxpool.Pool, parts []partners.Config, id int64) error {
	l := ledgerOn(db)
	for i := range parts {
		in, err := l.Get(ctx, parts[i].ID, id)
		if err != nil {
			return err
		}
		if in == nil || in.State != intake.StateDiscarded || in.ReceiptPath != "" {
			continue
		}
		if parts[i].Records() {
			return nil // claim: record: nothing is written on a read-only site
		}
		s, err := partners.Dial(ctx, &parts[i])
		if err != nil {
			return err
		}
		defer s.Close()
		return intake.PublishDiscarded(ctx, l, s, &parts[i], in)
	}
	return nil
}

func decide(ctx context.Context, tx pgx.Tx, d Decision, partner, qstate, action, detail string) error {
	return ledger.Decide(ctx, tx, d.IntakeID, partner, qstate, d.Request, d.Actor, d.Reason, action, detail)
}

// AuditEntry is one audited ops action.
type AuditEntry = ledger.AuditEntry

// Audit lists the given partners' ops actions, newest first; with
// request set, only the action of that request.
func Audit(ctx context.Context, db *pgxpool.Pool, partners []string, request string, limit int) ([]AuditEntry, error) {
	return ledgerOn(db).Audit(ctx, partners, request, limit)
}
