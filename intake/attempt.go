package intake

import (
	"context"
	"errors"
	"fmt"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/internal/fault"

	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// settle decides what a failed run means for its file, so that one file
// never holds up the partner's others: a final error fails the file now
// (failed_terminal, receipt, alert; replayable after the fix), a transient
// one is recorded with the file's own next attempt and the poll goes on
// without it, and past the retry budget the file fails too. It returns an
// error only when the poll cannot go on: the SFTP session is gone, or
// even recording the attempt failed (the database is away).
func (r *fileRun) settle(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err // a shutdown, not the file's failure: it resumes on the next start
	}
	if errors.Is(err, fault.ErrInjected) {
		return err // the crash tests' stand-in for a process that stops here
	}
	if errors.Is(err, errFeedHeld) {
		// the feed's table, not the file: it waits, no attempt counted,
		// and its owner's next resume renews its lease (targethold.go)
		if derr := r.d.ledger.Defer(ctx, r.in, targethold.Retry); derr != nil {
			var fe *ledger.FencedError
			if errors.As(derr, &fe) {
				r.fencedOut(fe.Step)
				return nil
			}
			return fmt.Errorf("intake %d: %w (deferring it failed: %v)", r.in.ID, err, derr)
		}
		r.log.Info("file waits for its feed's target table; no attempt counted", "reason", string(reason.TargetUnusable))
		return nil
	}
	switch classify(err) {
	case kindFinal, kindRefused:
		reason, detail := finalReason(err)
		r.log.Error("file failed for good", "reason", reason, "err", err)
		herr := r.hold(ctx, ledger.StateFailedTerminal, reason, 0, detail)
		if herr == nil {
			return nil
		}
		var fe *ledger.FencedError
		if errors.As(herr, &fe) {
			r.fencedOut(fe.Step)
			return nil
		}
		err = fmt.Errorf("%w (and holding the file failed: %w)", err, herr)
	}
	n, exhausted, rerr := r.recordAttempt(ctx, pgerr.Redact(err))
	var fe *ledger.FencedError
	switch {
	case errors.As(rerr, &fe):
		r.fencedOut(fe.Step)
		return nil
	case rerr != nil:
		return fmt.Errorf("intake %d: %w (recording the attempt failed: %v)", r.in.ID, err, rerr)
	case exhausted:
		r.log.Error("file failed past its retry budget", "attempts", n, "err", err)
		if herr := r.hold(ctx, ledger.StateFailedTerminal, reason.RetriesExhausted, 0, r.spentDetail(n, lastCodes(err))); herr != nil {
			if errors.As(herr, &fe) {
				r.fencedOut(fe.Step)
				return nil
			}
			// its next attempt holds it without running it again
			if merr := r.d.ledger.MarkSpent(ctx, r.in); merr != nil {
				r.log.Warn("recording the spent budget failed", "err", merr)
			}
			if !sessionLost(err) {
				r.log.Warn("holding the file failed; its next attempt holds it again without running it", "err", herr)
			}
		}
	default:
		r.log.Warn("file failed; retried on its own backoff while the partner's other files go on", "attempt", n, "err", err)
	}
	r.d.metrics.FileRetries.WithLabelValues(r.in.Partner).Inc()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		// an SFTP failure may be the session's or the site's (a directory
		// removed by hand): the next poll dials afresh and makes sure of
		// the directories again
		r.p.redial.Store(true)
	}
	if sessionLost(err) {
		return err // every other file of the partner would fail the same way now
	}
	return nil
}

// finalReason is the reason code and detail of a final error.
func finalReason(err error) (reason.Code, string) {
	var fe *FileError
	if errors.As(err, &fe) {
		return fe.Reason, fe.Detail
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return reason.TargetError, "the database refused the file's statements (" + pgerr.Codes(pe) + "); ops have been alerted and can replay the file after the fix"
	}
	return reason.TargetError, "the file could not be processed; ops have been alerted"
}

// lastCodes is what a partner's receipt says of a file's last error: the
// database's codes (SQLSTATE, constraint) when it refused, else nothing.
// The error's own text (a key file's path, a spool path, a database
// address) is ops' alone: the log and the ledger's last_error keep it.
func lastCodes(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return " (last: the database refused it, " + pgerr.Codes(pe) + ")"
	}
	return ""
}

// recordAttempt counts a failed run of the file and sets its next attempt,
// under the file's fencing token: the first failure is tried again on the
// next poll (a one-off, as most are), later ones after the base backoff
// doubling per attempt, capped, with jitter. exhausted: the budget is
// spent.
func (r *fileRun) recordAttempt(ctx context.Context, lastErr string) (n int, exhausted bool, err error) {
	retry := r.d.cfg.Retry
	n, age, err := r.d.ledger.RecordAttempt(ctx, r.in, lastErr, retry.Base, retry.Max)
	if err != nil {
		return 0, false, err
	}
	return n, n >= retry.Attempts || age >= retry.Within, nil
}
