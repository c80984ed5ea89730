package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Readiness stable (partners/ready.go ClassifyStable): a partner who
// cannot rename writes straight into ready/, and a file is claimed once
// listings have seen it unchanged for stable_for. The claim is still a
// RENAME into processing/<worker>/; an uploader still holding the file
// open writes on into the claimed file, so when the download ends the
// claimed file is compared with the listing it was claimed from: a
// changed size or mtime puts it back into ready/, unapplied, where its
// clock starts again.

// changedAfterClaim reports whether the claimed file's size or mtime
// differ from the listing it was claimed from, or from the bytes
// downloaded (got, -1 when the download did not end).
func (r *fetchStage) changedAfterClaim(got int64) (bool, error) {
	st, err := r.sess.Lstat(r.in.ClaimedPath)
	if sftpconn.IsNotExist(err) {
		return false, nil // row 12 decides
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", r.in.ClaimedPath, err)
	}
	// the mtime tells only where the server's RENAME keeps it (the claim
	// renamed the file); elsewhere the size alone tells
	changed := st.Size() != r.in.ListedSize || (got >= 0 && got != st.Size()) ||
		(!r.in.ListedMTime.IsZero() && !r.p.restamps.Load() && !st.ModTime().Equal(r.in.ListedMTime))
	return changed, nil
}

// errChangedBeforeCommit: a stable-readiness file changed since its
// listing, found right before its last commit (stillAsClaimed).
var errChangedBeforeCommit = errors.New("the file changed after its claim")

// stillAsClaimed looks at the claimed file once more right before the
// file's last commit, for readiness stable: an uploader still holding it
// open may have written on after the download ended. A file that grew
// or was touched since its listing is not committed as complete: the
// chunk is not sent (errChangedBeforeCommit) and the file is held
// changed_after_claim, the partner told (applyChunks).
func (r *fileRun) stillAsClaimed(ctx context.Context) error {
	if r.p.cfg.Readiness != partners.ReadinessStable || r.in.Override != "" || r.in.ReplayOf != 0 {
		return nil
	}
	if err := fault.Check("apply:before_last_commit"); err != nil {
		return err
	}
	changed, err := r.fetchStage().changedAfterClaim(r.in.Size)
	if err != nil {
		return err
	}
	if changed {
		r.log.Warn("file changed after its claim, found before its last commit: held, not committed", "reason", string(reason.ChangedAfterClaim))
		return errChangedBeforeCommit
	}
	return nil
}

// putBack ends the intake put_back (reason changed_after_claim) and
// renames the file back into ready/. The row changes first: a crash before
// the rename leaves the file in processing/<worker>/ without a live row,
// and resumeOwn (WasPutBack) puts it back instead of adopting it. When
// the partner has meanwhile written a new file under the same name in
// ready/, the claimed copy is held in quarantine instead (it is neither
// the partner's file nor complete).
func (r *fetchStage) putBack(ctx context.Context) error {
	in := r.in
	if r.p.cfg.Records() {
		// claim: record: the file never left ready/; dropping its claim
		// (with the row's change) is the put back
		if err := r.d.ledger.MarkPutBack(ctx, in); err != nil {
			return err
		}
		r.d.metrics.PutBack.WithLabelValues(in.Partner).Inc()
		r.log.Warn("file changed after its claim; claim dropped, not applied", "reason", string(reason.ChangedAfterClaim))
		return nil
	}
	if _, err := r.sess.Lstat(r.sess.Layout.Ready(in.RemoteName)); err == nil {
		return r.hold(ctx, ledger.StateQuarantined, reason.ChangedAfterClaim, 0,
			"the file changed after it was claimed and a new file of the same name is in ready/")
	}
	if err := r.d.ledger.MarkPutBack(ctx, in); err != nil {
		return err
	}
	r.d.metrics.PutBack.WithLabelValues(in.Partner).Inc()
	r.log.Warn("file changed after its claim; put back into ready/, not applied", "reason", string(reason.ChangedAfterClaim))
	if err := fault.Check("putback:after_mark"); err != nil {
		return err // as a crash here: resumeOwn finishes the put back
	}
	if !finishPutBack(r.d.log, r.p, r.sess, in.ClaimedPath, in.RemoteName, max(in.Size, in.ListedSize)) {
		return nil
	}
	if err := r.d.ledger.ForgetReady(ctx, in.Partner, in.RemoteName); err != nil {
		r.log.Warn("could not forget the file's stability record; the next listing does", "err", err)
	}
	return nil
}

// finishPutBack is sitefile.PutBack for a file whose intake ended put_back: a
// failure is the site's (ready/ missing or refused), never the file's or
// the poll's. It is logged, and the partner's next poll looks through this
// worker's processing dir and tries again (WasPutBack), so the file is
// never left there without an owner, and the partner's other files go on.
// It reports whether the file was put back.
func finishPutBack(log *slog.Logger, p *partnerRT, sess *sftpconn.Session, claimedPath, name string, size int64) bool {
	if err := sitefile.PutBack(sess, claimedPath, name, size); err != nil {
		log.Warn("could not put a file back into ready/; the next poll tries again", "partner", p.cfg.ID,
			"reason", string(reason.ChangedAfterClaim), "err", err)
		p.takenOver.Store(true)
		return false
	}
	return true
}
