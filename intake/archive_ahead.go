package intake

import (
	"bytes"
	"context"
	"errors"
	"path"
	"sync"
	"sync/atomic"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// The archive's site steps made ready while the file downloads. A file's
// end on the site is its move to archive/YYYY/MM/ and its receipt: on
// their own that is a STAT of the month's directory (and, for a month's
// first file, the STATs and MKDIRs that make it), the RENAME, then the
// receipt's OPEN, WRITE, CLOSE and RENAME — one round trip each: six,
// ten for a month's first file (docs/performance.md). Beside the
// file's download, its run makes sure of the month's directory and opens
// the receipt's temporary file (prepareSite), on the listing channel; at
// its end the receipt's bytes and the temporary file's CLOSE go out
// beside the move, then it is renamed to the receipt's name
// (moveBesideReceipt, publishAhead): two round trips (pkg/sftp's own CLOSE would wait for
// its WRITE, a third). A group's files do the same, prepared
// beside their reads (group_fetch.go).
// What the partner can see is as sitefile.Put's: the receipt appears by one
// rename of a complete, closed file, under the same fence.

// prepareSite starts making the file's archive ready on the site, beside
// its download: the month's directory made sure of and the receipt's
// temporary file opened (r.site). Records (claim: record) move nothing
// and write no receipt of this kind; a replay has no remote file.
func (r *fileRun) prepareSite() {
	if r.site != nil || r.feed == nil || r.p.cfg.Records() || r.in.ReplayOf != 0 {
		return
	}
	sess, in, log := r.sess, r.in, r.log
	name := sitefile.ReportStem(&ledger.Intake{ID: in.ID, BatchID: batchIDOf(r.feed, in.RemoteName, r.p.nocase.Load())}) + sitefile.ReceiptSuffix
	month := sess.Layout.ArchiveDir(in.ClaimedAt)
	r.site = inBackground(func() (*sitefile.Staged, error) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			// remembered by the session (EnsureDir); a failure is the
			// archive's to report when it moves the file
			_ = sess.EnsureDir(month)
		}()
		defer wg.Wait()
		st, err := sitefile.Stage(sess, sess.Layout.ReportsDir(), name, true) // a receipt: small
		if err != nil {
			log.Debug("the receipt's temporary file could not be opened ahead; it is written when the file is archived", "err", err)
		}
		return st, err
	})
}

// takeReceipt waits for prepareSite and hands over the receipt's
// temporary file it opened (nil when none): the caller publishes or
// discards it.
func (r *fileRun) takeReceipt() *sitefile.Staged {
	st, err := r.site.wait()
	r.site = nil
	if err != nil {
		return nil
	}
	return st
}

// dropSite discards a receipt's temporary file the run opened and did not
// publish (the file was held, or the run ended before its archive).
func (r *fileRun) dropSite() {
	if st := r.takeReceipt(); st != nil {
		st.Discard()
	}
}

// stagedFits reports whether the file's archive is the move (its
// manifest's beside it) and the receipt alone: no rejects report to write
// before the receipt, no replay (no remote file) and no release by ops (a
// reason file to remove).
func (r *finishStage) stagedFits() bool {
	in := r.in
	return in.ReplayOf == 0 && in.Override == "" && !r.redecided && in.RowsRejected+in.RowsConflict == 0
}

// aheadReceipt is a receipt's temporary file opened ahead, with the
// receipt's bytes written in it beside the file's move, waiting to be
// renamed to name.
type aheadReceipt struct {
	st   *sitefile.Staged
	name string
}

// discard removes the temporary file (nil: nothing to do).
func (a *aheadReceipt) discard() {
	if a != nil {
		a.st.Discard()
	}
}

// moveBesideReceipt is the move of moveToArchive with a receipt's
// temporary file opened ahead: rc's bytes, naming the archive name the
// move takes unless this very step ran before (the first candidate: it
// carries the intake id), are written into st while the RENAME is in
// flight. ahead is nil when the receipt cannot be used (the move took
// another name, a write failed): st is then discarded.
func (r *finishStage) moveBesideReceipt(st *sitefile.Staged, rc sitefile.Receipt, names []string) (dst string, ahead *aheadReceipt, err error) {
	in := r.in
	rc.Archive = names[0]
	data, err := sitefile.ReceiptJSON(in, rc)
	if err == nil {
		var name string
		if data, name, err = sitefile.Seal(r.feedPGP(), data, sitefile.ReportStem(in)+sitefile.ReceiptSuffix); err == nil {
			ahead = &aheadReceipt{st: st, name: name}
		}
	}
	if err != nil {
		st.Discard()
		return "", nil, err
	}
	var werr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = st.Write(bytes.NewReader(data), int64(len(data))) // discards the temporary file when it fails
	}()
	dst, err = moveOnce(r.sess, in.ClaimedPath, names)
	wg.Wait()
	if err != nil || dst != names[0] || werr != nil {
		if werr == nil {
			st.Discard()
		}
		return dst, nil, err
	}
	return dst, ahead, nil
}

// publishAhead renames the receipt written beside the move into place,
// under the receipt's fence, as sitefile.Put's, with the file's manifest
// moved beside that rename, once its file is in archive/ at dst (never
// ahead of its file). done is false when the temporary file could not be
// published (it is gone, or the rename failed): the receipt is then
// written anew, the moves made stay.
func (r *finishStage) publishAhead(ctx context.Context, a *aheadReceipt, dst string) (done bool, err error) {
	in := r.in
	if err := r.fence(ctx, "receipt"); err != nil {
		a.discard()
		return true, err
	}
	var manErr error
	var wg sync.WaitGroup
	if in.ManifestName != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			manErr = r.archiveManifest([]string{dst + partners.ManifestSuffix})
		}()
	}
	p, err := a.st.Publish(path.Join(r.sess.Layout.ReportsDir(), a.name))
	wg.Wait()
	if manErr != nil {
		// the step runs again (the moves made stay)
		return true, manErr
	}
	if errors.Is(err, fault.ErrInjected) {
		return true, err
	}
	if err != nil {
		// The temporary file is gone or could not be renamed: a file
		// that ran longer than reconcile.stale_temp had its receipt's
		// temporary file, opened when its download began, removed as
		// stale. The receipt is written anew.
		r.log.Warn("the receipt opened ahead could not be published; it is written anew", "err", err)
		return false, nil
	}
	stagedReceipts.Add(1)
	in.ReceiptPath = p
	return true, nil
}

// stagedReceipts counts the receipts published through a temporary file
// opened ahead (tests).
var stagedReceipts atomic.Int64
