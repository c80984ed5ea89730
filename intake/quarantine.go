package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// QuarantineReason is quarantine/<intake_id>.<name>.reason.json.
type QuarantineReason struct {
	PartnerID string      `json:"partner_id"`
	IntakeID  int64       `json:"intake_id"`
	File      string      `json:"file"`
	BatchID   string      `json:"batch_id,omitempty"`
	SHA256    string      `json:"sha256,omitempty"`
	State     string      `json:"state"`
	Reason    reason.Code `json:"reason"`
	Line      int64       `json:"line,omitempty"`
	Detail    string      `json:"detail"`
	At        time.Time   `json:"at"`
}

// hold takes a file out of the pipeline: it moves it (and its manifest) to
// quarantine/ beside a reason file, writes the partner's receipt and ends
// in state to (quarantined: waits for ops; failed_terminal: no retry).
// Each step is idempotent, so a crash part-way is finished on resume.
func (r *fileRun) hold(ctx context.Context, to ledger.State, reason reason.Code, line int64, detail string) error {
	r.dropAhead() // a held file applies nothing
	in, f := r.in, r.finishStage()
	qdir := r.sess.Layout.QuarantineDir()
	base := sitefile.HeldName(in.ID, in.RemoteName)
	if in.Feed == ledger.NoFeed {
		base = fmt.Sprintf("%d.%s", in.ID, reason) // a hostile name never enters our paths
	}
	if err := r.fence(ctx, "hold"); err != nil {
		return err
	}
	if r.p.cfg.Records() {
		return f.holdRecord(ctx, to, reason, line, detail)
	}
	ours, err := r.claimedIsOurs()
	if err != nil {
		return err
	}
	var dst string
	if ours {
		dst, err = f.moveHeld(in.ClaimedPath, path.Join(qdir, base))
	} else {
		err = fmt.Errorf("quarantine: %w", ErrRemoteLost)
	}
	lost := errors.Is(err, ErrRemoteLost)
	if err != nil && !lost {
		return fmt.Errorf("quarantine: %w", err)
	}
	if in.ManifestName != "" {
		src := path.Join(path.Dir(in.ClaimedPath), in.ManifestName)
		if _, err := f.moveHeld(src, path.Join(qdir, base+partners.ManifestSuffix)); err != nil && !errors.Is(err, ErrRemoteLost) {
			return fmt.Errorf("quarantine manifest: %w", err)
		}
	}
	if lost {
		r.d.metrics.RemoteLost.WithLabelValues(in.Partner).Inc()
		dst = path.Join(qdir, base) // the reason file still tells ops what happened
	}
	receiptQ := dst
	if in.ReplayOf != 0 {
		// a replay has no file of its own on the site (its bytes were
		// archived as the original's): what is held is ops' replay, and
		// the original's receipt stands; nothing lies in quarantine/
		detail = fmt.Sprintf("replay of intake %d, asked by ops, held: %s; what intake %d applied stands as its receipt says", in.ReplayOf, detail, in.ReplayOf)
		receiptQ = ""
	}
	qr := QuarantineReason{PartnerID: in.Partner, IntakeID: in.ID, File: sitefile.Neutralize(in.RemoteName), BatchID: in.BatchID,
		SHA256: in.SHA256, State: string(to), Reason: reason, Line: line, Detail: detail, At: time.Now().UTC().Truncate(time.Second)}
	data, _ := json.MarshalIndent(qr, "", "  ")
	if err := r.fence(ctx, "reason"); err != nil {
		return err
	}
	if _, err := sitefile.Put(r.sess, qdir, sitefile.ReasonName(path.Base(dst)), append(data, '\n')); err != nil {
		return fmt.Errorf("quarantine reason: %w", err)
	}
	outcome := ledger.OutcomeQuarantined
	if to == ledger.StateFailedTerminal {
		outcome = ledger.OutcomeFailed
	}
	if err := f.writeReports(ctx, sitefile.Receipt{Outcome: outcome, Reason: reason, Line: line, Detail: detail, Quarantine: receiptQ}); err != nil {
		return err
	}
	in.ArchivePath = dst
	if err := fault.Check("hold:before_finish"); err != nil {
		return err
	}
	if err := r.d.ledger.Finish(ctx, in, in.State, to, reason); err != nil {
		return err
	}
	r.d.metrics.Finished(in.Partner, string(to))
	r.log.Warn("file held", "state", to, "reason", reason, "line", line, "quarantine_path", dst)
	return nil
}

// moveHeld moves src to dst in quarantine/; a released file held again is
// there already.
func (r *finishStage) moveHeld(src, dst string) (string, error) {
	if src == dst {
		if _, err := r.sess.Lstat(dst); err == nil {
			return dst, nil
		}
	}
	defer r.sess.AllowCopy(max(r.in.Size, r.in.ListedSize))() // a RENAME that copies answers late
	return moveOnce(r.sess, src, []string{dst})
}

// dropStaleReason removes the reason file a released file was held with:
// once the file is decided again (archived, or held with a new reason
// file), the old one would tell the partner and the reconciler something
// no longer true.
func (r *finishStage) dropStaleReason() error {
	if r.in.Override == "" || r.feed == nil {
		return nil // never released
	}
	return r.removeReason()
}

// unhold moves a file, and its manifest, back from quarantine/ to its
// claimed path when an earlier attempt held it there before its bytes were
// spooled and its end was never recorded (its reason file, receipt or
// Finish failed, so the row stayed claimed): the download then decides
// again what that attempt decided, and the file is held with that reason,
// not taken for lost. Only the download of a row resumed from an earlier
// attempt or run looks (one LSTAT).
func (r *fetchStage) unhold(ctx context.Context) error {
	if r.feed == nil || r.p.cfg.Records() {
		return nil // a hostile entry keeps its generated name; a record is never moved
	}
	if _, err := r.sess.Lstat(r.in.ClaimedPath); !sftpconn.IsNotExist(err) {
		return nil // in place (or the site's error, which the download meets)
	}
	if err := r.fence(ctx, "unhold"); err != nil {
		return err
	}
	held := path.Join(r.sess.Layout.QuarantineDir(), sitefile.HeldName(r.in.ID, r.in.RemoteName))
	isHeld := func(p string) (bool, error) {
		_, err := r.sess.Lstat(p)
		if err != nil && !sftpconn.IsNotExist(err) {
			return false, fmt.Errorf("look in quarantine: %w", err)
		}
		return err == nil, nil
	}
	data, err := isHeld(held)
	if err != nil {
		return err
	}
	// the manifest alone: the earlier hold found the file lost, and the
	// download is to find that again, not the manifest gone
	man := false
	if r.in.ManifestName != "" {
		if man, err = isHeld(held + partners.ManifestSuffix); err != nil {
			return err
		}
	}
	if !data && !man {
		return nil // not held either: the download finds it lost
	}
	r.redecided = true
	// the data file last: until it is back, the next attempt looks again
	if err := r.finishStage().removeReason(); err != nil {
		return err
	}
	if man {
		m := path.Join(path.Dir(r.in.ClaimedPath), r.in.ManifestName)
		if err := r.sess.Rename(held+partners.ManifestSuffix, m); err != nil && !sftpconn.IsNotExist(err) {
			return fmt.Errorf("take the held manifest back from quarantine: %w", err)
		}
	}
	if !data {
		return nil
	}
	err = r.sess.RenameSized(held, r.in.ClaimedPath, max(r.in.Size, r.in.ListedSize))
	if err != nil && !sftpconn.IsNotExist(err) {
		return fmt.Errorf("take the held file back from quarantine: %w", err)
	}
	r.log.Warn("the file was in quarantine/ from a hold whose end was never recorded; decided again", "quarantine_path", held)
	return nil
}

// removeReason removes the file's reason file from quarantine/ (gone
// already is fine).
func (r *finishStage) removeReason() error {
	p := path.Join(r.sess.Layout.QuarantineDir(), sitefile.ReasonName(sitefile.HeldName(r.in.ID, r.in.RemoteName)))
	if err := r.sess.Remove(p); err != nil && !sftpconn.IsNotExist(err) {
		return fmt.Errorf("remove stale reason file: %w", err)
	}
	return nil
}
