package intake

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sync/atomic"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// writeReports publishes the receipt and, when rows did not apply, the
// rejects report, on the partner's site. A decision after an earlier one
// (a released file, or one whose hold's end was never recorded) removes
// what that one published under other names (sitefile.EarlierNames), and
// its rejects report when this one rejects no row: it would otherwise stand beside a receipt that says
// rows.rejected 0 (the feed was fixed, the missing parent rows added).
func (r *finishStage) writeReports(ctx context.Context, rc sitefile.Receipt) error {
	in := r.in
	// what the earlier decision published, as the row recorded it (a
	// release keeps them: ledger.Reopen)
	earlierReceipt, earlierRejects := in.ReceiptPath, in.RejectsPath
	dir := r.sess.Layout.ReportsDir()
	rejects := ""
	if in.RowsRejected+in.RowsConflict > 0 {
		p, err := r.putRejects(ctx, dir)
		if err != nil {
			return err
		}
		in.RejectsPath, rc.Rejects = p, p
		rejects = path.Base(p)
	}
	again := in.Override != "" || r.redecided // a decision after an earlier one
	if again {
		if err := r.dropEarlier(ctx, sitefile.RejectsSuffix, rejects, earlierRejects); err != nil {
			return err
		}
		if rejects == "" {
			in.RejectsPath = ""
		}
	}
	rc.Archive = in.ArchivePath
	data, err := sitefile.ReceiptJSON(in, rc)
	if err != nil {
		return err
	}
	name := sitefile.ReportStem(in) + sitefile.ReceiptSuffix
	if data, name, err = sitefile.Seal(r.feedPGP(), data, name); err != nil {
		return err
	}
	if err := r.fence(ctx, "receipt"); err != nil {
		return err
	}
	p, err := sitefile.Put(r.sess, dir, name, data)
	if err != nil {
		return err
	}
	in.ReceiptPath = p
	if again {
		return r.dropEarlier(ctx, sitefile.ReceiptSuffix, name, earlierReceipt)
	}
	return nil
}

// replayedBefore: a replay that ends archived is the latest decision on
// the rows of the bytes it applied again. The earlier intakes of those
// bytes (the one it writes as, and that one's earlier replays) published
// receipts saying which rows stood then, and rejects reports listing rows
// refused, which the replay may have applied since. Each such receipt is
// published again naming the replay (replayed_by), its rows as they
// were, and its rejects report is removed: the partner reads the replay's
// for the rows refused now. Under the replay's fence, after its own
// reports are up; a run stopped part way does it again when resumed. An
// earlier receipt the reports' retention purged (at neither its recorded
// path nor the one it is published at now) is not published again; one
// whose place the site denies this account is logged and left (the
// replay's own reports stand), not made the replay's failure; any other
// error is the replay's, retried.
func (r *finishStage) replayedBefore(ctx context.Context) error {
	in := r.in
	if in.ReplayOf == 0 {
		return nil
	}
	earlier, err := r.d.ledger.ReplayedBefore(ctx, in)
	if err != nil {
		return err
	}
	dir := r.sess.Layout.ReportsDir()
	for _, e := range earlier {
		if e.ReceiptPath == "" {
			continue
		}
		name := sitefile.SealedName(r.feedPGP(), sitefile.ReportStem(e.Intake)+sitefile.ReceiptSuffix)
		purged, err := r.receiptGone(e.ReceiptPath, path.Join(dir, name))
		if err == nil && !purged {
			err = r.publishReplayed(ctx, e, dir)
		}
		if sftpconn.IsPermission(err) {
			r.log.Warn("the site denies the place of the receipt of an intake this replay applied again; it is left as it is",
				"replayed_intake", e.ID, "err", err)
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// receiptGone reports whether an earlier receipt is at neither its
// recorded path nor the path it is published at now: purged.
func (r *finishStage) receiptGone(paths ...string) (bool, error) {
	for _, p := range paths {
		_, err := r.sess.Lstat(p)
		if err == nil {
			return false, nil
		}
		if !sftpconn.IsNotExist(err) {
			return false, fmt.Errorf("look for a replayed intake's receipt: %w", err)
		}
	}
	return true, nil
}

// publishReplayed removes e's rejects report, publishes e's receipt again
// naming this replay, and records both on e's row. The report goes first:
// stopped part way, the receipt is still found and the step done again.
func (r *finishStage) publishReplayed(ctx context.Context, e ledger.Replayed, dir string) error {
	in := r.in
	outcome := ledger.OutcomeAccepted
	if e.RowsRejected+e.RowsConflict > 0 {
		outcome = ledger.OutcomeAcceptedWithRejects
	}
	rc := sitefile.Receipt{Outcome: outcome, Reason: e.Reason, ReplayedBy: in.ID, Archive: e.ArchivePath, ProcessedAt: e.FinishedAt,
		Detail: fmt.Sprintf("replayed by intake %d on request of ops: its bytes applied again; the replay's receipt and rejects report say which rows of this file stand now", in.ID)}
	if e.ReplayOf != 0 {
		rc.Archive = "" // its bytes were archived as the original's
	}
	data, err := sitefile.ReceiptJSON(e.Intake, rc)
	if err != nil {
		return err
	}
	name := sitefile.ReportStem(e.Intake) + sitefile.ReceiptSuffix
	if data, name, err = sitefile.Seal(r.feedPGP(), data, name); err != nil {
		return err
	}
	if err := r.fence(ctx, "replayed reports"); err != nil {
		return err
	}
	if err := sitefile.RemoveEarlier(r.sess, e.Intake, sitefile.RejectsSuffix, "", e.RejectsPath); err != nil {
		return err
	}
	if err := r.fence(ctx, "replayed receipt"); err != nil {
		return err
	}
	p, err := sitefile.Put(r.sess, dir, name, data)
	if err != nil {
		return fmt.Errorf("intake %d's receipt naming its replay: %w", e.ID, err)
	}
	if err := r.fence(ctx, "replayed receipt"); err != nil {
		return err
	}
	if err := sitefile.RemoveEarlier(r.sess, e.Intake, sitefile.ReceiptSuffix, name, e.ReceiptPath); err != nil {
		return err
	}
	return r.d.ledger.RecordReplayedBy(ctx, e.Intake, in, p)
}

// dropEarlier removes the reports of this kind an earlier decision of the
// file published under another name than keep (sitefile.EarlierNames),
// and at recorded, the path its row recorded.
func (r *finishStage) dropEarlier(ctx context.Context, suffix, keep, recorded string) error {
	if err := r.fence(ctx, "earlier reports"); err != nil {
		return err
	}
	return sitefile.RemoveEarlier(r.sess, r.in, suffix, keep, recorded)
}

// putRejects publishes the rejects report in dir. It is written, sealed
// when the feed encrypts reports, into a temporary file in the spool's
// temp area and copied to the site from there: its size does not add to
// the process's memory. Its lines are the ones rendered from the plan
// beside the apply (renderRejects) when they are still the file's every
// row issue, else read from the ledger. The temporary file is removed
// when done; one a crash leaves behind is removed with the worker's
// other temporary files.
func (r *finishStage) putRejects(ctx context.Context, dir string) (string, error) {
	f, err := r.d.spool.CreateTemp(r.in.Partner)
	if err != nil {
		return "", fmt.Errorf("rejects report: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	start := time.Now()
	bw := bufio.NewWriterSize(f, 64<<10)
	w, name, err := sitefile.SealTo(bw, r.feedPGP(), sitefile.ReportStem(r.in)+sitefile.RejectsSuffix)
	if err != nil {
		return "", err
	}
	source := "ledger"
	planned, why := r.rejects.Take(func() (int64, int64, error) { return r.d.ledger.IssueCounts(ctx, r.in) })
	r.rejects = nil
	if why != nil {
		r.log.Debug("the rejects report's lines rendered from the plan are not used; they are read from the ledger", "err", why)
	}
	if planned != nil {
		source = "plan"
		rejectsFromPlan.Add(1)
		_, err = io.Copy(w, planned)
		planned.Close()
	} else {
		err = sitefile.RejectsCSV(w, func(row func(ledger.IssueRow) error) error { return r.d.ledger.Issues(ctx, r.in, row) })
	}
	if err != nil {
		return "", fmt.Errorf("rejects report: %w", err)
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	if err := bw.Flush(); err != nil {
		return "", fmt.Errorf("rejects report: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("rejects report: %w", err)
	}
	rendered := time.Now()
	// fenced after the upload, right before the rename that shows it: a
	// large report's upload can outlast a lease
	p, err := sitefile.PutFrom(r.sess, dir, name, f, st.Size(), func() error { return r.fence(ctx, "rejects rename") })
	if err == nil {
		r.log.Debug("rejects report published", "bytes", st.Size(), "lines_from", source, "render_seconds", rendered.Sub(start).Seconds(),
			"put_seconds", time.Since(rendered).Seconds())
	}
	return p, err
}

// rejectsFromPlan counts the rejects reports whose lines were rendered
// from the plan (tests).
var rejectsFromPlan atomic.Int64

// renderRejects starts rendering the rejects report's lines from a plan
// that recorded sc's rejected rows, when the scan held every one of them
// (sitefile.PlannedRejects), in place of those of an earlier plan.
func (r *planStage) renderRejects(sc *scan) {
	r.rejects.Drop()
	r.rejects = nil
	if sc.rejected == 0 || sc.overflow {
		return
	}
	spool, partner := r.d.spool, r.in.Partner
	r.rejects = sitefile.RenderPlanned(func() (*os.File, error) { return spool.CreateTemp(partner) }, sc.rejected,
		func(row func(ledger.IssueRow) error) error {
			for i := range sc.held {
				is := sc.issue(i)
				if err := row(ledger.IssueRow{Line: is.Line, Column: is.Column, Reason: is.Reason, Outcome: ledger.IssueRejected}); err != nil {
					return err
				}
			}
			return nil
		})
}
