package intake

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitename"
	"github.com/partner-intake/partner-intake/partners"
)

// Receipt is reports/<batch>.<intake_id>.receipt.json.
type Receipt struct {
	PartnerID   string         `json:"partner_id"`
	IntakeID    int64          `json:"intake_id"`
	File        string         `json:"file"`
	BatchID     string         `json:"batch_id,omitempty"`
	SHA256      string         `json:"sha256,omitempty"`
	Bytes       int64          `json:"bytes"`
	Outcome     ledger.Outcome `json:"outcome"`
	Reason      ledger.Reason  `json:"reason,omitempty"`
	Line        int64          `json:"line,omitempty"`
	Detail      string         `json:"detail,omitempty"`
	DuplicateOf int64          `json:"duplicate_of,omitempty"`
	// SupersededBy: outcome superseded, the newer snapshot's intake.
	SupersededBy int64       `json:"superseded_by,omitempty"`
	Rows         ReceiptRows `json:"rows"`
	Archive      string      `json:"archive_path,omitempty"`
	Quarantine   string      `json:"quarantine_path,omitempty"`
	Rejects      string      `json:"rejects_report,omitempty"`
	ProcessedAt  time.Time   `json:"processed_at"`
}

// ReceiptRows are the row totals; they add up to Total.
type ReceiptRows struct {
	Total     int64 `json:"total"`
	Applied   int64 `json:"applied"`
	Unchanged int64 `json:"unchanged"`
	Rejected  int64 `json:"rejected"`
	Conflict  int64 `json:"conflict"`
	// Deleted: rows of the partner's earlier files a snapshot deleted (or
	// marked deleted) because their key is not in this file; not rows of
	// this file, so not part of Total.
	Deleted int64 `json:"deleted,omitempty"`
	// DeleteKept: rows of the partner's earlier files a snapshot would
	// have deleted but kept, because they were edited outside intake since
	// intake wrote them (reason outside_edit); not part of Total.
	DeleteKept int64 `json:"delete_kept_outside_edit,omitempty"`
}

// reportStem names a file's reports: <batch>.<intake_id>, unique per
// observed file so a resend's receipt never overwrites the original's;
// with either suffix within maxRemoteName bytes.
func reportStem(in *ledger.Intake) string {
	if in.BatchID != "" {
		return fitStem("", in.BatchID, fmt.Sprintf(".%d", in.ID), sitename.ReceiptSuffix+sitename.EncryptedSuffix)
	}
	return fmt.Sprintf("intake-%d", in.ID)
}

// writeReports publishes the receipt and, when rows did not apply, the
// rejects report, on the partner's site.
func (r *fileRun) writeReports(ctx context.Context, rc Receipt) error {
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
	data, err := receiptJSON(in, rc)
	if err != nil {
		return err
	}
	name := reportStem(in) + sitename.ReceiptSuffix
	if data, name, err = sealReport(r.feedPGP(), data, name); err != nil {
		return err
	}
	if err := r.fence(ctx, "receipt"); err != nil {
		return err
	}
	p, err := putFile(r.sess, dir, name, data)
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
// receipt keeps (reportStem), sealed or not.
func (r *fileRun) dropStaleRejects(ctx context.Context) error {
	if err := r.fence(ctx, "stale rejects"); err != nil {
		return err
	}
	name := path.Join(r.sess.Layout.ReportsDir(), reportStem(r.in)+sitename.RejectsSuffix)
	for _, p := range []string{name, name + sitename.EncryptedSuffix} {
		if err := r.sess.Remove(p); err != nil && !partners.IsNotExist(err) {
			return fmt.Errorf("remove stale rejects report: %w", err)
		}
	}
	r.in.RejectsPath = ""
	return nil
}

// receiptJSON completes rc with what the row says of the file and renders
// it.
func receiptJSON(in *ledger.Intake, rc Receipt) ([]byte, error) {
	rc.PartnerID, rc.IntakeID, rc.File, rc.BatchID = in.Partner, in.ID, in.RemoteName, in.BatchID
	rc.SHA256, rc.Bytes = in.SHA256, in.Size
	rc.Rows = ReceiptRows{Total: in.RowsTotal, Applied: in.RowsApplied, Unchanged: in.RowsUnchanged, Rejected: in.RowsRejected, Conflict: in.RowsConflict, Deleted: in.RowsDeleted, DeleteKept: in.RowsDeleteKept}
	rc.ProcessedAt = time.Now().UTC().Truncate(time.Second)
	data, err := json.MarshalIndent(rc, "", "  ")
	return append(data, '\n'), err
}

// putRejects publishes the rejects report in dir. It is written, sealed
// when the feed encrypts reports, into a temporary file in the spool's
// temp area and copied to the site from there: its size does not add to
// the process's memory. The temporary file is removed when done; one a
// crash leaves behind is removed with the worker's other temporary files.
func (r *fileRun) putRejects(ctx context.Context, dir string) (string, error) {
	f, err := r.d.spool.CreateTemp(r.in.Partner)
	if err != nil {
		return "", fmt.Errorf("rejects report: %w", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	bw := bufio.NewWriterSize(f, 64<<10)
	w, name, err := sealTo(bw, r.feedPGP(), reportStem(r.in)+sitename.RejectsSuffix)
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
	if err := r.fence(ctx, "rejects"); err != nil {
		return "", err
	}
	return putFileFrom(r.sess, dir, name, f, st.Size())
}

// rejectsCSV renders line, column, reason, outcome and detail (codes: the
// SQLSTATE of a row the target refused) of every row that did not apply. It
// echoes no cell value; every cell is still neutralised
// against spreadsheet formula injection.
func (r *fileRun) rejectsCSV(ctx context.Context, out io.Writer) error {
	w := csv.NewWriter(out)
	_ = w.Write([]string{"line", "column", "reason", "outcome", "detail"})
	err := r.d.ledger.Issues(ctx, r.in, func(is ledger.IssueRow) error {
		return w.Write([]string{strconv.FormatInt(is.Line, 10), Neutralize(is.Column), Neutralize(is.Reason), Neutralize(is.Outcome), Neutralize(is.Detail)})
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
