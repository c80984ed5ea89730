package intake

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// finishStage is a file's end on the partner's site: the file moved to
// archive/ with its manifest, its receipt and rejects report published,
// and its end recorded.
type finishStage struct{ *fileRun }

// finishStage starts the file's end.
func (r *fileRun) finishStage() *finishStage { return &finishStage{r} }

// archive moves an applied file to archive/YYYY/MM/ under a name that is
// unique by construction (<batch>.<sha256[:12]>.<intake_id><ext>), never
// overwriting, then writes the receipt and rejects report and records the
// end: applied -> archived. Archive is evidence, not the commit point: the
// rows were committed before this step, and a crash here is finished on
// resume without re-applying anything.
func (r *finishStage) archive(ctx context.Context, from ledger.State, outcome ledger.Outcome, dupOf int64) error {
	to, reason, err := r.archiveRemote(ctx, outcome, dupOf)
	if err != nil {
		return err
	}
	if err := r.d.ledger.Finish(ctx, r.in, from, to, reason); err != nil {
		return err
	}
	r.archived(outcome, to)
	return nil
}

// archiveRemote is archive's work on the partner's site, one step after
// the other: the fence, the file moved to archive/ (moveToArchive), then
// its manifest beside it and its receipt (and rejects report) published.
// A receipt's temporary file opened ahead (archive_ahead.go) is an option
// of the same steps: its bytes go out beside the move and it is renamed
// into place beside the manifest's move; when that does not come off, the
// receipt is written as it is without. It returns the state the file ends
// in and its reason.
func (r *finishStage) archiveRemote(ctx context.Context, outcome ledger.Outcome, dupOf int64) (ledger.State, reason.Code, error) {
	in := r.in
	if r.p.cfg.Records() {
		return r.archiveRecord(outcome)
	}
	st := r.takeReceipt()
	if st != nil && !r.stagedFits() {
		st.Discard()
		st = nil
	}
	dst, lost, ahead, err := r.moveToArchive(ctx, st, r.receipt(outcome, dupOf, false))
	if err != nil {
		return "", "", err
	}
	in.ArchivePath = dst
	if err := fault.Check("archive:mid"); err != nil {
		ahead.discard()
		return "", "", err
	}
	if ahead != nil {
		if done, err := r.publishAhead(ctx, ahead, dst); done {
			if err != nil {
				return "", "", err
			}
			return endState(outcome), reasonOf(outcome), nil
		}
	}
	if in.ManifestName != "" && in.ReplayOf == 0 {
		// beside the archived file; when the file was lost, under the
		// archive name it would have had: left in processing/, a later
		// delivery of the name would meet it as its manifest
		dsts := []string{dst + partners.ManifestSuffix}
		if lost {
			dsts = dsts[:0]
			for _, n := range sitefile.ArchiveNames(r.sess.Layout.ArchiveDir(in.ClaimedAt), in, 9) {
				dsts = append(dsts, n+partners.ManifestSuffix)
			}
		}
		if err := r.archiveManifest(dsts); err != nil {
			return "", "", err
		}
	}
	rc := r.receipt(outcome, dupOf, lost)
	if err := r.writeReports(ctx, rc); err != nil {
		return "", "", err
	}
	if outcome == ledger.OutcomeAccepted || outcome == ledger.OutcomeAcceptedWithRejects {
		// a replay that applied its rows (not one superseded)
		if err := r.replayedBefore(ctx); err != nil {
			return "", "", err
		}
	}
	if err := r.dropStaleReason(); err != nil {
		return "", "", err
	}
	return endState(outcome), reasonOf(outcome), nil
}

// moveToArchive moves the claimed file to archive/YYYY/MM/ under its
// fence, once (moveOnce: a move an earlier attempt made is found), or
// takes it back from quarantine/ where an unrecorded hold left it
// (reclaimHeld). lost: the file is gone from processing/ (the rows are
// committed and the spool keeps the bytes: finish, and say so loudly,
// matrix row 12). A replay has no remote file: dst is "".
//
// st, when not nil, is the receipt's temporary file opened ahead: rc's
// bytes, naming the archive name the move takes, are written into it
// beside the move, and ahead holds it for publishAhead. When that does
// not come off (the move took another name, a write failed), st is
// discarded and ahead is nil: the receipt is written anew.
func (r *finishStage) moveToArchive(ctx context.Context, st *sitefile.Staged, rc sitefile.Receipt) (dst string, lost bool, ahead *aheadReceipt, err error) {
	in := r.in
	if in.ReplayOf != 0 { // its bytes were archived as the original's
		st.Discard()
		return "", false, nil, nil
	}
	if err := r.fence(ctx, "archive"); err != nil {
		st.Discard()
		return "", false, nil, err
	}
	ours, err := r.claimedIsOurs()
	if err != nil {
		st.Discard()
		return "", false, nil, err
	}
	dir := r.sess.Layout.ArchiveDir(in.ClaimedAt)
	names := sitefile.ArchiveNames(dir, in, 9)
	if ours {
		copied := r.sess.AllowCopy(in.Size) // a RENAME that copies answers late
		if st != nil {
			dst, ahead, err = r.moveBesideReceipt(st, rc, names)
		} else {
			dst, err = moveOnce(r.sess, in.ClaimedPath, names)
		}
		copied()
	} else {
		st.Discard()
		err = fmt.Errorf("archive: %w", ErrRemoteLost)
	}
	if errors.Is(err, ErrRemoteLost) {
		if held, ok, herr := r.reclaimHeld(ctx, dir); herr != nil {
			return "", false, nil, herr
		} else if ok {
			dst, err = held, nil
		}
	}
	lost = errors.Is(err, ErrRemoteLost)
	if err != nil && !lost {
		return "", false, nil, fmt.Errorf("archive: %w", err)
	}
	if lost {
		r.log.Error("remote file vanished from processing/ before archiving; the spool keeps the bytes", "reason", reason.RemoteLost)
		r.d.metrics.RemoteLost.WithLabelValues(in.Partner).Inc()
	}
	return dst, lost, ahead, nil
}

// archiveManifest moves the file's manifest from beside its claim to the
// first free name of dsts; one already gone is no error.
func (r *finishStage) archiveManifest(dsts []string) error {
	src := path.Join(path.Dir(r.in.ClaimedPath), r.in.ManifestName)
	if _, err := moveOnce(r.sess, src, dsts); err != nil && !errors.Is(err, ErrRemoteLost) {
		return fmt.Errorf("archive manifest: %w", err)
	}
	return nil
}

// reclaimHeld takes the file back from quarantine/ into the archive when
// an earlier attempt held it there but its end was never recorded (the
// hold's Finish failed after it had moved the file and published its
// reason file and receipt; the row stayed live, and this attempt decided
// otherwise): the file and its manifest are moved to the archive and the
// reason file, which no longer holds, is removed, so the partner does not
// read a held file beside this decision's receipt. ok is false when
// quarantine/ does not hold the file either.
func (r *finishStage) reclaimHeld(ctx context.Context, dir string) (dst string, ok bool, err error) {
	if r.feed == nil {
		return "", false, nil // a hostile entry is never applied
	}
	// the archive's fence may be a stall old: a worker that took the file
	// over since may have held it there, recorded
	if err := r.fence(ctx, "reclaim"); err != nil {
		return "", false, err
	}
	qdir := r.sess.Layout.QuarantineDir()
	held := path.Join(qdir, sitefile.HeldName(r.in.ID, r.in.RemoteName))
	copied := r.sess.AllowCopy(r.in.Size)
	dst, err = moveOnce(r.sess, held, sitefile.ArchiveNames(dir, r.in, 9))
	copied()
	if errors.Is(err, ErrRemoteLost) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("archive from quarantine: %w", err)
	}
	if _, err := moveOnce(r.sess, held+partners.ManifestSuffix, []string{dst + partners.ManifestSuffix}); err != nil && !errors.Is(err, ErrRemoteLost) {
		return "", false, fmt.Errorf("archive manifest from quarantine: %w", err)
	}
	// the move may have been a copy that outlasted the fence: a reason
	// file a new owner's hold wrote meanwhile is the truth
	if err := r.fence(ctx, "reclaim reason"); err != nil {
		return "", false, err
	}
	if err := r.removeReason(); err != nil {
		return "", false, err
	}
	r.redecided = true
	r.log.Warn("the file was in quarantine/ from a hold whose end was never recorded; archived from there", "quarantine_path", held)
	return dst, true, nil
}

// endState is the state a file archived with outcome ends in, reasonOf
// its reason.
func endState(outcome ledger.Outcome) ledger.State {
	if outcome == ledger.OutcomeDuplicate {
		return ledger.StateDuplicate
	}
	return ledger.StateArchived
}

func reasonOf(outcome ledger.Outcome) reason.Code {
	switch outcome {
	case ledger.OutcomeDuplicate:
		return reason.Duplicate
	case ledger.OutcomeSuperseded:
		return reason.Superseded
	}
	return ""
}

// receipt is what the receipt of a file archived with outcome says
// beyond what the row says (sitefile.ReceiptJSON); lost: the file vanished from
// processing/ before it could be moved.
func (r *finishStage) receipt(outcome ledger.Outcome, dupOf int64, lost bool) sitefile.Receipt {
	in := r.in
	rc := sitefile.Receipt{Outcome: outcome, DuplicateOf: dupOf}
	if lost {
		rc.Detail = "the file disappeared from processing/ before it could be archived; its bytes are kept in intake's spool"
	}
	if in.ReplayOf != 0 {
		rc.Detail = fmt.Sprintf("replay of intake %d: its bytes applied again on request of ops", in.ReplayOf)
	}
	if outcome == ledger.OutcomeSuperseded {
		rc.DuplicateOf, rc.SupersededBy = 0, dupOf
		rc.Reason = reason.Superseded
		rc.Detail = fmt.Sprintf("a newer snapshot of this feed (intake %d) was applied before this one; this file's rows are not applied, so the table keeps the newer set", dupOf)
	}
	if outcome == ledger.OutcomeDuplicate {
		rc.Reason = reason.Duplicate
		rc.Detail = fmt.Sprintf("batch %s was already received with the same bytes (intake %d); nothing was applied again", in.BatchID, dupOf)
		if r.byManifest {
			rc.Detail = fmt.Sprintf("batch %s was already received with the bytes your manifest states (sha256 and byte count, intake %d); the file was not read and nothing was applied again", in.BatchID, dupOf)
		}
	}
	return rc
}

// archived counts and logs a file that archive finished.
func (r *finishStage) archived(outcome ledger.Outcome, to ledger.State) {
	in := r.in
	r.d.metrics.Finished(in.Partner, string(to))
	r.log.Info("file done", "outcome", outcome, "rows_total", in.RowsTotal, "rows_applied", in.RowsApplied,
		"rows_unchanged", in.RowsUnchanged, "rows_rejected", in.RowsRejected, "rows_conflict", in.RowsConflict, "archive", in.ArchivePath)
}
