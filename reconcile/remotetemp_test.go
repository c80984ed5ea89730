package reconcile_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// reportsWithTemps archives one file of a fresh site and leaves in its
// reports/, beside the file's receipt (its mtime set back past
// reconcile.stale_temp too): a receipt write's hidden temporary file as a
// kill leaves it, older than reconcile.stale_temp; a fresh one (a live
// write); an old dotfile and an old directory that only look like one.
func reportsWithTemps(t *testing.T, id string) (n *node, site *testenv.Site, receipt, stale, fresh string, kept []string) {
	t.Helper()
	_, pool := testenv.DB(t)
	site = testenv.NewSite(t, id)
	site.Drop(t, "orders-t.csv", testenv.OrdersCSV("T", 3))
	n = newNode(t, pool, "w1", t.TempDir(), site)
	if err := n.poll(t, id); err != nil {
		t.Fatal(err)
	}
	f := testenv.Files(t, pool, id)[0]
	if f.State != "archived" || f.Receipt == "" {
		t.Fatalf("%+v, want archived with a receipt", f)
	}
	reports := filepath.Join(site.Root, "reports")
	receipt = filepath.Join(reports, filepath.Base(f.Receipt))
	base := filepath.Base(f.Receipt)
	stale = filepath.Join(reports, "."+base+".0123456789abcdef.tmp")
	fresh = filepath.Join(reports, "."+base+".fedcba9876543210.tmp")
	dotfile := filepath.Join(reports, ".keep")
	dir := filepath.Join(reports, "."+base+".aaaaaaaaaaaaaaaa.tmp")
	for _, p := range []string{stale, fresh, dotfile} {
		if err := os.WriteFile(p, []byte(`{"partner_id":`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{stale, fresh, dotfile, dir} {
		if !sitefile.IsOurTemp(filepath.Base(p)) && p != dotfile {
			t.Fatalf("%s is not named as a receipt write's temporary file", p)
		}
	}
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{stale, dotfile, dir, receipt} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	return n, site, receipt, stale, fresh, []string{fresh, dotfile, dir, receipt}
}

// A receipt write killed between its temporary file and the rename leaves
// the temporary file in reports/: the reconciler removes it once it is
// older than reconcile.stale_temp, by the name it listed, and removes
// nothing else there: not a fresh temporary file (a live write), not the
// receipts however old, not other dotfiles, not a directory.
func TestStaleReceiptTempsInReportsAreRemovedAndNothingElse(t *testing.T) {
	n, _, receipt, stale, _, kept := reportsWithTemps(t, "rtmp")
	before, err := os.ReadFile(receipt)
	if err != nil {
		t.Fatal(err)
	}
	fs := n.reconcile(t)
	if kinds(fs)[ledger.KindStaleRemoteTemp] != 1 {
		t.Fatalf("findings %+v, want one stale_remote_temp", fs)
	}
	for _, f := range fs {
		if f.Kind == ledger.KindStaleRemoteTemp && (filepath.Base(f.Path) != filepath.Base(stale) || f.Action != "deleted") {
			t.Fatalf("finding %+v, want the stale temporary file deleted", f)
		}
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary file is still there: %v", err)
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("%s was removed: %v", filepath.Base(p), err)
		}
	}
	if after, err := os.ReadFile(receipt); err != nil || string(after) != string(before) {
		t.Fatalf("the receipt changed: %v", err)
	}
	// the next run finds nothing more to remove
	if fs := n.reconcile(t); kinds(fs)[ledger.KindStaleRemoteTemp] != 0 {
		t.Fatalf("findings %+v", fs)
	}
}

// The listing's verdict is checked again when it is acted on: a temporary
// file stale when listed whose writer wrote to it since (a stalled writer
// that woke up) is kept; one still stale is removed.
func TestAStaleTempWrittenToAfterTheListingIsKept(t *testing.T) {
	n, _, _, stale, _, _ := reportsWithTemps(t, "rtmp2")
	other := filepath.Join(filepath.Dir(stale), ".other.receipt.json.00000000000000ff.tmp")
	if err := os.WriteFile(other, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(other, old, old); err != nil {
		t.Fatal(err)
	}
	const step = "reconcile:remote_temps_listed"
	withFault(t, step+"=pause")
	t.Cleanup(func() { fault.Resume(step) })
	done := make(chan error, 1)
	var fs []ledger.Finding
	go func() {
		var err error
		fs, err = n.rec.RunOnce(t.Context())
		done <- err
	}()
	select {
	case <-fault.Paused(step):
	case err := <-done:
		t.Fatalf("the reconciler ended (%v) before %s", err, step)
	case <-time.After(30 * time.Second):
		t.Fatalf("the reconciler never reached %s", step)
	}
	// the writer wakes up and writes on
	f, err := os.OpenFile(stale, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`"more"`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fault.Resume(step)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stale); err != nil {
		t.Fatalf("a temporary file written to after the listing was removed: %v", err)
	}
	if _, err := os.Lstat(other); !os.IsNotExist(err) {
		t.Fatalf("the temporary file still stale was kept: %v", err)
	}
	if kinds(fs)[ledger.KindStaleRemoteTemp] != 1 {
		t.Fatalf("findings %+v, want one stale_remote_temp (the file still stale)", fs)
	}
}
