package intake_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The per-file path opens a file's receipt ahead, during its download
// (archive_ahead.go), and writes it beside the archive move. Whatever the
// file's end — archived, archived with a rejects report, an exact resend,
// held — its receipt tells that end and names what it should, and no
// temporary file is left in reports/.
func TestReceiptsOpenedAheadTellEveryEndAndLeaveNoTemporaryFile(t *testing.T) {
	defer intake.SetScanCheckBytes(0)()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	drops := []struct{ name, content string }{
		{"orders-a.csv", goodRows("A", 3)},
		{"orders-b.csv", goodRows("B", 2) + "B-9,not-an-email,10.00,paid,2026-11-01T10:00:00Z,1\n"},
		{"orders-a.csv", goodRows("A", 3)},
		{"orders-c.csv", "order_id,email,amount,status,placed_at,qty,extra\nE-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1,x\n"},
	}
	staged := intake.StagedReceipts()
	for _, d := range drops { // one a poll: each alone, on the per-file path
		site.Drop(t, d.name, d.content)
		r.poll("acme")
	}
	// the clean file and the resend published the receipt opened ahead;
	// the file with a refused row (a rejects report first) and the held
	// one did not
	if n := intake.StagedReceipts() - staged; n != 2 {
		t.Fatalf("%d receipts published through the temporary file opened ahead, want 2", n)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 4 {
		t.Fatalf("got %d intake rows, want 4", len(fs))
	}
	want := []struct {
		state   string
		outcome ledger.Outcome
	}{
		{"archived", ledger.OutcomeAccepted},
		{"archived", ledger.OutcomeAcceptedWithRejects},
		{"duplicate", ledger.OutcomeDuplicate},
		{"failed_terminal", "failed"},
	}
	for i, f := range fs {
		if f.State != want[i].state || f.Receipt == "" {
			t.Fatalf("file %d: %+v, want state %s with a receipt", i, f, want[i].state)
		}
		rc := receipt(t, site, f.Receipt)
		if rc.Outcome != want[i].outcome || rc.IntakeID != f.ID {
			t.Fatalf("file %d: receipt %+v, want outcome %s for intake %d", i, rc, want[i].outcome, f.ID)
		}
		if f.State != "failed_terminal" && (rc.Archive == "" || rc.Archive != f.Archive) {
			t.Fatalf("file %d: the receipt names archive %q, the row %q", i, rc.Archive, f.Archive)
		}
	}
	if rc := receipt(t, site, fs[1].Receipt); rc.Rejects == "" || rc.Rejects != fs[1].Rejects {
		t.Fatalf("the receipt of the file with a refused row names rejects %q, the row %q", rc.Rejects, fs[1].Rejects)
	}
	if rc := receipt(t, site, fs[2].Receipt); rc.DuplicateOf != fs[0].ID {
		t.Fatalf("the resend's receipt says duplicate of %d, want %d", rc.DuplicateOf, fs[0].ID)
	}
	reports := site.Files(t, "reports")
	for _, f := range reports {
		if sitefile.IsOurTemp(filepath.Base(f)) {
			t.Fatalf("a receipt's temporary file was left in reports/: %s (all: %v)", f, reports)
		}
	}
	if len(reports) != 5 { // four receipts and one rejects report
		t.Fatalf("reports/ holds %v, want four receipts and one rejects report", reports)
	}
}

// A receipt's temporary file opened ahead can be removed before the
// file's end: the reconciler removes one older than reconcile.stale_temp,
// and a file that runs longer has one that old. The file is archived all
// the same and its receipt written anew, naming the archive.
func TestAReceiptOpenedAheadAndRemovedIsWrittenAnew(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-a.csv", goodRows("A", 3))
	staged := intake.StagedReceipts()
	resume := r.pollPaused("acme", "publish:archive")
	removed := 0
	for _, f := range site.Files(t, "reports") {
		if sitefile.IsOurTemp(filepath.Base(f)) {
			if err := os.Remove(filepath.Join(site.Root, "reports", f)); err != nil {
				t.Fatal(err)
			}
			removed++
		}
	}
	if removed != 1 {
		t.Fatalf("removed %d temporary files from reports/, want the one opened ahead", removed)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Receipt == "" {
		t.Fatalf("got %+v, want the file archived with a receipt", fs)
	}
	rc := receipt(t, site, fs[0].Receipt)
	if rc.Outcome != ledger.OutcomeAccepted || rc.Archive != fs[0].Archive || rc.IntakeID != fs[0].ID {
		t.Fatalf("receipt %+v, want accepted naming archive %s", rc, fs[0].Archive)
	}
	if n := intake.StagedReceipts() - staged; n != 0 {
		t.Fatalf("%d receipts published through the removed temporary file", n)
	}
	for _, f := range site.Files(t, "reports") {
		if sitefile.IsOurTemp(filepath.Base(f)) {
			t.Fatalf("a temporary file was left in reports/: %s", f)
		}
	}
}
