package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// fileRun drives one claimed file through its states. Each step reads the
// row's state, does its work idempotently and moves the row on with a
// conditional statement, so a run can start (or restart) in any state.
type fileRun struct {
	d    *Daemon
	p    *partnerRT
	sess *sftpconn.Session
	in   *ledger.Intake
	// idHold: the worker id's hold the run began under; its fences pass
	// only under it (remote.go fence, workerid.go)
	idHold *ledger.Hold
	feed   *partners.Feed
	log    *slog.Logger
	// progress, if set, hears of every committed chunk (replay's bar).
	progress func(done, total int64)
	// bound is the batch binding made with the spooled transition.
	bound *ledger.Binding
	// pre is the rows' scan made during the download, for plan.
	pre *preScan
	// ahead applies the file's chunks while it downloads, for apply.
	ahead *ahead
	// aheadSlot: a slot for the apply ahead, taken before it starts by
	// the decryption that hands it the plaintext alone (followUnwrap);
	// read and written on that decryption's goroutine only.
	aheadSlot bool
	// rejects: the rejects report's lines rendered from the plan, for
	// the report (report.go).
	rejects *sitefile.PlannedRejects
	// gone: the file's feed is no longer configured.
	gone bool
	// byManifest: spooled as an exact resend from its manifest alone,
	// without reading the file (manifestDuplicate).
	byManifest bool
	// groupFencedAt: when the file's group checked its token and renewed
	// its lease right before the group's steps on the site (fence); zero
	// on the per-file path.
	groupFencedAt time.Time
	// site: the archive's steps on the site made ready during the
	// download, or a group's read (archive_ahead.go).
	site *background[*sitefile.Staged]
	// opening: the file opened behind its claim's RENAME, until the
	// download takes it (openClaimed).
	opening *sftpconn.Opening
	// placed: this run put the file at its claimed path (its claim) or
	// read it there: what is at the path is its bytes (claimedIsOurs).
	placed bool
	// redecided: this run found the file held by an earlier attempt of
	// its own whose end was never recorded (unhold, reclaimHeld): a
	// decision after an earlier one, as a released file's
	redecided bool
}

func (d *Daemon) newRun(p *partnerRT, sess *sftpconn.Session, in *ledger.Intake) (*fileRun, error) {
	r := &fileRun{d: d, p: p, sess: sess, in: in, idHold: d.workerID.Current(),
		log: d.log.With("partner", in.Partner, "intake_id", in.ID, "feed", in.Feed)}
	r.feed = p.cfg.Feed(in.Feed)
	if r.feed == nil && in.Feed != ledger.NoFeed {
		// the configuration lost the file's feed while the file was in
		// flight: the file fails with its reason (replayable once the feed
		// is back) rather than holding up the partner
		r.gone = true
	}
	return r, nil
}

// terminal reports whether the worker is done with a state.
func terminal(s ledger.State) bool {
	switch s {
	case ledger.StateArchived, ledger.StateDuplicate, ledger.StateQuarantined, ledger.StateFailedTerminal, ledger.StateDiscarded, ledger.StatePutBack, ledger.StateOutcomeUnknown,
		ledger.StateAwaitingApproval: // waits for ops, held by no worker
		return true
	}
	return false
}

// run drives the file until it leaves the worker's hands. A heartbeat
// extends the lease meanwhile; when it finds the file fenced off, the run's
// context is cancelled and the run stops.
func (r *fileRun) run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer keepLeases(ctx, r.d, r.log, []*ledger.Intake{r.in}, cancel, nil)()
	defer r.dropPre()
	defer r.dropAhead()
	defer r.dropSite()
	defer func() { r.rejects.Drop() }()

	for !terminal(r.in.State) {
		var err error
		start := time.Now()
		stage := r.in.State
		switch {
		case r.gone && r.in.State != ledger.StateApplied: // applied rows only need their archive
			err = r.hold(ctx, ledger.StateFailedTerminal, reason.FeedGone, 0,
				fmt.Sprintf("feed %s is no longer configured for this partner; the file can be replayed once it is", r.in.Feed))
		default:
			err = r.step(ctx)
		}
		r.d.metrics.Stage(r.in.Partner, stage, time.Since(start))
		r.log.Debug("step done", "from", stage, "to", r.in.State, "seconds", time.Since(start).Seconds())
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			return err
		}
	}
	r.dropExpanded(ctx)
	return nil
}

// step runs the step of the file's state.
func (r *fileRun) step(ctx context.Context) (err error) {
	switch r.in.State {
	case ledger.StateClaimed:
		if r.in.Reason == reason.RetriesExhausted && r.feed != nil { // its hold failed past the budget
			return r.endSpent(ctx)
		}
		if r.feed == nil {
			why := hostileReason(r.in.ClaimedPath)
			err = r.hold(ctx, ledger.StateQuarantined, why, 0, hostileDetail[why])
		} else {
			r.prepareSite()
			err = r.fetchStage().download(ctx)
		}
	case ledger.StateSpooled:
		if r.in.Reason == reason.RetriesExhausted { // its group's COMMIT went unanswered past the budget; nothing of it landed
			return r.endSpent(ctx)
		}
		if r.in.PlanDecision == planRejected {
			// ops rejected the file's plan (intake reject): held, nothing
			// applied; its bytes are not needed for that
			r.dropPre()
			r.dropAhead()
			detail := "the file's plan against the target was rejected by review before anything was applied; nothing of it was applied. Contact us before sending it again"
			if r.in.RowsAppliedEarlier > 0 {
				detail = "the file's plan against the target was rejected by review; nothing of it was applied since ops released it" + sitefile.AppliedBeforeRelease(r.in, false) + ". Contact us before sending it again"
			}
			return r.hold(ctx, ledger.StateQuarantined, reason.PlanRejected, 0, detail)
		}
		if r.bound != nil && r.bound.Verdict == ledger.VerdictDuplicate {
			// a duplicate needs no bytes: it is archived as it lies on the
			// site (and one decided from its manifest was never read)
			err = r.planStage().decide(ctx)
		} else if err = r.fetchStage().haveData(ctx); err == nil && r.in.State == ledger.StateSpooled {
			err = r.planStage().decide(ctx)
		}
	case ledger.StateApplying:
		if r.in.Reason == reason.RetriesExhausted { // its last commit went unanswered past the budget
			return r.endSpent(ctx)
		}
		if err = r.fetchStage().haveData(ctx); err == nil && r.in.State == ledger.StateApplying {
			err = r.applyStage().apply(ctx)
		}
	case ledger.StateApplied:
		err = r.finishStage().archive(ctx, ledger.StateApplied, r.acceptedOutcome(), 0)
	default:
		err = fmt.Errorf("intake %d: no step for state %s", r.in.ID, r.in.State)
	}
	return err
}

// notRegularDetail explains reason.NotRegularFile (a claim that moved a non-regular file) to the partner.
const notRegularDetail = "the file claimed from ready/ was not a regular file by then (a symbolic link, directory or device put in its place after it was listed); it was not followed or read"

// hostileDetail explains each hostile-entry reason to the partner.
var hostileDetail = map[reason.Code]string{
	reason.NotRegularFile: "the entry in ready/ is not a regular file (a symbolic link, directory or device); it was not followed or read",
	reason.BadName:        "the file name has control characters, path separators or invalid UTF-8, or is too long; the file was not read",
	reason.DeceptiveName:  "the file name has Unicode format characters (bidirectional overrides, zero-width characters) or line separators, which make it show other than it is; the file was not read",
	reason.NoFeed:         "no feed agreed with you matches this file name; the file was not read",
}

func (r *fileRun) acceptedOutcome() ledger.Outcome {
	if r.in.RowsRejected+r.in.RowsConflict > 0 {
		return ledger.OutcomeAcceptedWithRejects
	}
	return ledger.OutcomeAccepted
}

// keepLeases renews the leases of a run's files, one file's or a
// group's, every third of a lease on a goroutine of its own until the
// stop it returns (which waits for it). Only ids and tokens are read,
// which a run never changes. lost, when not nil, is told when a file is
// no longer held (a FencedError), and the renewals stop; renewed, when
// not nil, after each renewal.
func keepLeases(ctx context.Context, d *Daemon, log *slog.Logger, ins []*ledger.Intake, lost func(error), renewed func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		everyTick(ctx, d.ledger.Lease()/3, func() bool {
			held, err := d.ledger.Renew(ctx, ins, nil)
			if err != nil && ctx.Err() == nil {
				log.Warn("heartbeat failed", "err", err)
			}
			if err == nil && lost != nil {
				for _, in := range ins {
					if !held[in.ID] {
						lost(&ledger.FencedError{IntakeID: in.ID, Token: in.Token, Step: "Heartbeat"})
						return false
					}
				}
			}
			if renewed != nil {
				renewed()
			}
			return true
		})
	}()
	return func() { cancel(); <-done }
}

// decide binds the batch and routes the spooled file: a duplicate is
// archived without business effect, a conflict is quarantined, a new batch
// is planned and then applied, held, or failed.
func (r *planStage) decide(ctx context.Context) error {
	verdict, owner, err := ledger.VerdictNew, r.in.ID, error(nil)
	switch {
	case r.in.ReplayOf != 0: // a replay applies the same batch again on purpose
	case r.bound != nil: // bound when the file was spooled
		verdict, owner = r.bound.Verdict, r.bound.Owner
	default: // resumed, or bound meanwhile by another intake
		verdict, owner, err = r.d.ledger.BindBatch(ctx, r.in)
	}
	if err != nil {
		return err
	}
	if verdict != ledger.VerdictNew {
		r.dropPre()
		r.dropAhead()
	}
	switch verdict {
	case ledger.VerdictDuplicate:
		return r.finishStage().archive(ctx, ledger.StateSpooled, ledger.OutcomeDuplicate, owner)
	case ledger.VerdictConflict:
		return r.hold(ctx, ledger.StateQuarantined, reason.BatchConflict, 0,
			fmt.Sprintf("batch %s was already received with other bytes (intake %d); a resend under the same batch id must carry the same bytes", r.in.BatchID, owner))
	}
	if done, err := r.supersededAtPlan(ctx); done || err != nil {
		return err
	}
	res, err := r.plan(ctx)
	if err != nil {
		return err
	}
	if res.Fail != nil || res.Hold != "" || r.in.State != ledger.StateApplying {
		r.dropAhead() // nothing of the file is applied now
	}
	switch {
	case res.Fail != nil:
		return r.fileFailure(ctx, res.Fail)
	case res.Hold == reason.RejectRate:
		return r.hold(ctx, ledger.StateQuarantined, reason.RejectRate, 0,
			fmt.Sprintf("%d of %d rows were rejected, more than the feed allows (%.0f%%); see the rejects report", res.Rejected, res.Total, 100*r.feed.MaxRejectRatio))
	case res.Hold == reason.ManifestMismatch:
		return r.hold(ctx, ledger.StateQuarantined, reason.ManifestMismatch, 0,
			fmt.Sprintf("the file has %d rows, its manifest states %d", res.Total, *r.in.ExpectedRows))
	}
	return nil
}
