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
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// writeReports publishes the receipt and, when rows did not apply, the
// rejects report, on the partner's site.
func (r *finishStage) writeReports(ctx context.Context, rc sitefile.Receipt) error {
	in := r.in
	dir := r.sess.Layout.ReportsDir()
	if in.RowsRejected+in.RowsConflict > 0 {
		p, err := r.putRejects(ctx, dir)
		if err != nil {
			return err
		}
		in.RejectsPath, rc.Rejects = p, p
	} else if in.Override != "" {
		if err := r.dropStaleRejects(ctx); err != nil {
			return err
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
	return nil
}

// dropStaleRejects removes the rejects report a released file's earlier
// decision published, when its new decision rejects no row: the report
// would otherwise stand beside a receipt that says rows.rejected 0 (the
// feed was fixed, the missing parent rows added). Its name is the one the
// receipt keeps (sitefile.ReportStem), sealed or not.
func (r *finishStage) dropStaleRejects(ctx context.Context) error {
	if err := r.fence(ctx, "stale rejects"); err != nil {
		return err
	}
	name := path.Join(r.sess.Layout.ReportsDir(), sitefile.ReportStem(r.in)+sitefile.RejectsSuffix)
	for _, p := range []string{name, name + sitefile.EncryptedSuffix} {
		if err := r.sess.Remove(p); err != nil && !sftpconn.IsNotExist(err) {
			return fmt.Errorf("remove stale rejects report: %w", err)
		}
	}
	r.in.RejectsPath = ""
	return nil
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
	if err := r.fence(ctx, "rejects"); err != nil {
		return "", err
	}
	fenced := time.Now()
	p, err := sitefile.PutFrom(r.sess, dir, name, f, st.Size())
	if err == nil {
		r.log.Debug("rejects report published", "bytes", st.Size(), "render_seconds", rendered.Sub(start).Seconds(),
			"fence_seconds", fenced.Sub(rendered).Seconds(), "put_seconds", time.Since(fenced).Seconds())
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
