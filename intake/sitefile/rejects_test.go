package sitefile_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/reason"
)

// The lines rendered from a plan are handed over only while the ledger's
// counts say the plan's rejected rows are still the file's every row
// issue; their file is unlinked as soon as it is made, so nothing of it
// stays in the spool's temp area, used or not.
func TestPlannedRejectsAreUsedOnlyWhileTheLedgersCountsAgree(t *testing.T) {
	issues := []ledger.IssueRow{
		{Line: 3, Column: "email", Reason: reason.Code("bad_email"), Outcome: ledger.IssueRejected},
		{Line: 7, Reason: reason.Code("field_count"), Outcome: ledger.IssueRejected},
		{Line: 9, Column: "=qty", Reason: reason.Code("not_integer"), Outcome: ledger.IssueRejected},
	}
	each := func(row func(ledger.IssueRow) error) error {
		for _, is := range issues {
			if err := row(is); err != nil {
				return err
			}
		}
		return nil
	}
	want := "line,column,reason,outcome,detail\n3,email,bad_email,rejected,\n7,,field_count,rejected,\n9,'=qty,not_integer,rejected,\n"
	dir := t.TempDir()
	create := func() (*os.File, error) { return os.CreateTemp(dir, "rejects-*.tmp") }
	counts := func(rejected, conflict int64, err error) func() (int64, int64, error) {
		return func() (int64, int64, error) { return rejected, conflict, err }
	}
	for _, tc := range []struct {
		name   string
		counts func() (int64, int64, error)
		used   bool
	}{
		{"the plan's rows alone", counts(3, 0, nil), true},
		{"a row the apply rejected", counts(4, 0, nil), false},
		{"a row held back in conflict", counts(3, 1, nil), false},
		{"the counts unread", counts(0, 0, errors.New("connection lost")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sitefile.RenderPlanned(create, 3, each)
			f, _ := p.Take(tc.counts)
			if (f != nil) != tc.used {
				t.Fatalf("lines handed over: %v, want %v", f != nil, tc.used)
			}
			if f != nil {
				got, err := io.ReadAll(f)
				f.Close()
				if err != nil || string(got) != want {
					t.Fatalf("lines %q (%v), want %q", got, err, want)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 0 {
				t.Fatalf("files left in the temp area: %v", left)
			}
		})
	}
	var none *sitefile.PlannedRejects
	if f, why := none.Take(counts(3, 0, nil)); f != nil || why != nil {
		t.Fatal("no lines rendered, yet some handed over")
	}
	none.Drop()
}
