package ops

import (
	"context"
	"fmt"
	"path"
	"slices"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Winners of a batch conflict.
const (
	WinnerNew = "new" // the held (newer) bytes win: they are applied over the batch
	WinnerOld = "old" // the earlier bytes stay: the held file is discarded
)

// ActionOldWins is the audited action of a batch conflict's release with
// the earlier bytes winning: the held file is discarded.
const ActionOldWins = "release_conflict_old_wins"

// ListQuarantine lists the held files of the given partners, newest first.
func ListQuarantine(ctx context.Context, db *pgxpool.Pool, partners []string, openOnly bool) ([]ledger.QuarantineItem, error) {
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
	// Hold is the token of the hold decided on (ledger.HoldToken), as the
	// actor saw it: the decision is refused when the file was held again
	// since, with another reason. The CLI and the console always name it;
	// "" decides on the hold that stands.
	Hold string
}

func (d Decision) check() error {
	if d.Actor == "" || d.Reason == "" {
		return fmt.Errorf("%w: an actor and a reason are required", ledger.ErrDecision)
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
//
// A decision's audit row is its transaction's first write: under the
// grants' row-level security (intake/ledger/grants.sql) an ops role may
// change a file's rows only in a transaction that has audited that file
// as the same login. So the decision is planned from a first look at the
// held file, audited, and then made under the file's lock, refused if the
// file changed in between.
func Release(ctx context.Context, db *pgxpool.Pool, d Decision) error {
	return decideHeld(ctx, db, d, func(tx pgx.Tx, seen *ledger.Held) error {
		r, err := planRelease(d, seen)
		if err != nil {
			return err
		}
		if err := ledger.AuditDecision(ctx, tx, d.IntakeID, seen.Partner, d.Request, d.Actor, d.Reason, r.action, r.detail); err != nil {
			return err
		}
		h, err := ledger.LockHeld(ctx, tx, d.IntakeID, d.Partners)
		if err != nil {
			return err
		}
		if h == nil || *h != *seen {
			return fmt.Errorf("%w: intake %d changed while it was being decided; look again", ledger.ErrDecision, d.IntakeID)
		}
		if r.discard {
			return discard(ctx, tx, d)
		}
		if r.rebind {
			if err := ledger.RebindBatch(ctx, tx, h, d.IntakeID); err != nil {
				return err
			}
		}
		reopened, err := ledger.Reopen(ctx, tx, d.IntakeID, r.next, r.override, h.Path, r.manifest)
		if err != nil {
			return err
		}
		if !reopened {
			return fmt.Errorf("%w: intake %d is in state %s", ledger.ErrDecision, d.IntakeID, h.FState)
		}
		return ledger.MarkDecided(ctx, tx, d.IntakeID, "released", d.Actor, d.Reason)
	})
}

// decideHeld is a decision on a held file: d checked, then, in one
// transaction, the file's first look (ledger.PeekHeld; nil: not held)
// handed to decide, which audits and makes the decision.
func decideHeld(ctx context.Context, db *pgxpool.Pool, d Decision, decide func(tx pgx.Tx, seen *ledger.Held) error) error {
	if err := d.check(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		seen, err := ledger.PeekHeld(ctx, tx, d.IntakeID, d.Partners)
		if err != nil {
			return err
		}
		return decide(tx, seen)
	})
}

// stillOpen refuses a decision on a file that is not held or was decided
// already.
func stillOpen(d Decision, h *ledger.Held) error {
	if h == nil {
		return fmt.Errorf("%w: intake %d is not held", ledger.ErrDecision, d.IntakeID)
	}
	if h.QState != "open" {
		return fmt.Errorf("%w: intake %d was already %s", ledger.ErrDecision, d.IntakeID, h.QState)
	}
	if d.Hold != "" && d.Hold != h.Hold {
		return fmt.Errorf("%w: intake %d was held again since hold %s: it is now hold %s (%s); look at it again (intake quarantine show %d) and decide on that hold",
			ledger.ErrDecision, d.IntakeID, d.Hold, h.Hold, h.Reason, d.IntakeID)
	}
	return nil
}

// release is what a release of a held file does (planRelease).
type release struct {
	action, detail  string
	discard, rebind bool
	override        string
	next            ledger.State
	manifest        string
}

// discardOnlyWhy says why a file held for each of ledger.DiscardOnly can
// only be discarded.
var discardOnlyWhy = map[reason.Code]string{
	reason.NotRegularFile: "was not a regular file when claimed (" + string(reason.NotRegularFile) + "): it can only be discarded",
	reason.BadBatchID:     "has no usable batch id: it can only be discarded",
	// its spool holds the bytes as they were when it was claimed, a copy
	// the partner was still writing: released, they would be applied as
	// the whole file
	reason.ChangedAfterClaim: "changed after it was claimed (the partner was still writing it): its spooled bytes are part of the file; it can only be discarded, and the partner publishes the complete file again under a new name",
}

// planRelease decides what releasing the held file h does, or refuses.
func planRelease(d Decision, h *ledger.Held) (release, error) {
	if err := stillOpen(d, h); err != nil {
		return release{}, err
	}
	r := release{action: "release"}
	switch {
	case h.Feed == ledger.NoFeed:
		return r, fmt.Errorf("%w: intake %d is a hostile entry (%s): it can only be discarded", ledger.ErrDecision, d.IntakeID, h.Reason)
	case slices.Contains(ledger.DiscardOnly, string(h.Reason)):
		return r, fmt.Errorf("%w: intake %d %s", ledger.ErrDecision, d.IntakeID, discardOnlyWhy[h.Reason])
	case h.Reason == reason.BatchConflict:
		switch d.Winner {
		case WinnerOld:
			return release{action: ActionOldWins, discard: true}, nil
		case WinnerNew:
			r.override, r.rebind = ledger.OverrideConflictNewWin, true
		default:
			return r, fmt.Errorf("%w: releasing a batch conflict needs --winner new or --winner old", ledger.ErrDecision)
		}
	case h.Reason == reason.RejectRate:
		r.override = ledger.OverrideRejectRate
	case h.Reason == reason.ManifestMismatch:
		r.override = ledger.OverrideManifest
	case h.Reason == reason.FileTooLarge:
		r.override = ledger.OverrideSize
	}
	if r.override == "" {
		r.override = ledger.OverrideNothing
	}
	r.next = ledger.StateSpooled
	if h.SHA256 == "" {
		r.next = ledger.StateClaimed
	}
	r.manifest = h.Manifest
	if r.manifest != "" && h.Path != "" {
		r.manifest = path.Base(h.Path) + partners.ManifestSuffix // held beside the data file
	}
	r.detail = fmt.Sprintf("reason %s, override %q, resumes as %s", h.Reason, r.override, r.next)
	return r, nil
}

// Discard closes a held file for good; it stays in quarantine/ as evidence
// until retention removes it. Audited first, as Release.
func Discard(ctx context.Context, db *pgxpool.Pool, d Decision) error {
	return decideHeld(ctx, db, d, func(tx pgx.Tx, seen *ledger.Held) error {
		if err := stillOpen(d, seen); err != nil {
			return err
		}
		if err := ledger.AuditDecision(ctx, tx, d.IntakeID, seen.Partner, d.Request, d.Actor, d.Reason, "discard", ""); err != nil {
			return err
		}
		h, err := ledger.LockHeld(ctx, tx, d.IntakeID, d.Partners)
		if err != nil {
			return err
		}
		if h == nil || *h != *seen {
			return fmt.Errorf("%w: intake %d changed while it was being decided; look again", ledger.ErrDecision, d.IntakeID)
		}
		return discard(ctx, tx, d)
	})
}

// discard closes a held file, audited already. The partner's receipt and
// the reason file still say "held": the same statement takes a new fencing
// token and marks its receipt pending, and PublishDiscarded (run by the command
// right after, or by the reconciler when that failed) publishes the
// decision under that token.
func discard(ctx context.Context, tx pgx.Tx, d Decision) error {
	worker := d.Worker
	if worker == "" {
		worker = "discarded"
	}
	closed, err := ledger.CloseHeld(ctx, tx, d.IntakeID, worker)
	if err != nil {
		return err
	}
	if !closed {
		return fmt.Errorf("%w: intake %d is not held", ledger.ErrDecision, d.IntakeID)
	}
	return ledger.MarkDecided(ctx, tx, d.IntakeID, "discarded", d.Actor, d.Reason)
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
		if in == nil {
			continue // another partner's
		}
		if !in.DiscardUnpublished() {
			return nil // a release, or published already
		}
		if parts[i].Records() {
			return nil // claim: record: nothing is written on a read-only site
		}
		s, err := sftpconn.Dial(ctx, &parts[i])
		if err != nil {
			return err
		}
		defer s.Close()
		return sitefile.PublishDiscarded(ctx, l, s, &parts[i], in)
	}
	return nil
}

// Audit lists the given partners' ops actions, newest first; with
// request set, only the action of that request.
func Audit(ctx context.Context, db *pgxpool.Pool, partners []string, request string, limit int) ([]ledger.AuditEntry, error) {
	return ledgerOn(db).Audit(ctx, partners, request, limit)
}
