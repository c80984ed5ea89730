package intake

import (
	"bufio"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
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
// the process's memory. The temporary file is removed when done; one a
// crash leaves behind is removed with the worker's other temporary files.
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
	if err := r.rejectsCSV(ctx, w); err != nil {
		return "", err
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
		r.log.Debug("rejects report published", "bytes", st.Size(), "render_seconds", rendered.Sub(start).Seconds(),
			"put_seconds", time.Since(rendered).Seconds())
	}
	return p, err
}

// rejectsCSV renders line, column, reason, outcome and detail (codes: the
// SQLSTATE of a row the target refused) of every row that did not apply. It
// echoes no cell value; every cell is still neutralised
// against spreadsheet formula injection.
func (r *finishStage) rejectsCSV(ctx context.Context, out io.Writer) error {
	w := csv.NewWriter(out)
	_ = w.Write([]string{"line", "column", "reason", "outcome", "detail"})
	err := r.d.ledger.Issues(ctx, r.in, func(is ledger.IssueRow) error {
		return w.Write([]string{strconv.FormatInt(is.Line, 10), Neutralize(is.Column), Neutralize(string(is.Reason)), Neutralize(is.Outcome), Neutralize(is.Detail)})
	})
	if err != nil {
		return err
	}
	w.Flush()
	return w.Error()
}

// Neutralize makes a cell safe to open in a spreadsheet: a cell starting
// with =, +, -, @, tab or CR is prefixed with a single quote (OWASP CSV
// injection).
func Neutralize(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}
