package reconcile_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/reconcile"
)

// Row 1 for hostile entries: a worker id that never registered (a one-shot
// run) claimed a directory and a symlink out of ready/ under generated
// hostile names and was killed before their rows. The reconciler of
// another worker adopts each whatever it is, and they are held in
// quarantine/ unread, the link's target untouched. Being no regular files,
// they were passed over before the hostile name was looked at, and stayed
// in the gone worker's dir for good, unreported. A hold of an entry it
// had not claimed itself left a directory or symlink where it was, as
// not its file: each poll then adopted it again as a new intake.
func TestAGoneWorkersHostileEntriesAreHeldWhateverTheyAre(t *testing.T) {
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "hleft")
	gone := filepath.Join(site.Root, "processing", "w-once")
	dir := filepath.Join(gone, "hostile-not_regular_file-1-0a0b0c0d")
	link := filepath.Join(gone, "hostile-not_regular_file-2-0e0f1011")
	secret := filepath.Join(t.TempDir(), "secret.csv")
	for _, err := range []error{
		os.MkdirAll(dir, 0o755),
		os.WriteFile(filepath.Join(dir, "orders-in-a-dir.csv"), []byte("x"), 0o644),
		os.WriteFile(secret, []byte("do not read"), 0o644),
		os.Symlink(secret, link),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	w2 := newNode(t, pool, "w2", t.TempDir(), site)
	fs := w2.reconcile(t)
	adopted := 0
	for _, f := range fs {
		if f.Kind == ledger.KindOrphanClaim && f.IntakeID != 0 && strings.Contains(f.Path, "/processing/w-once/hostile-") {
			adopted++
		}
	}
	if adopted != 2 || reconcile.NeedHuman(fs) {
		t.Fatalf("findings %+v, want both hostile entries adopted, nothing for a human", fs)
	}
	if err := w2.poll(t, "hleft"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := w2.poll(t, "hleft"); err != nil {
			t.Fatal(err)
		}
	}
	rows := testenv.Files(t, pool, "hleft")
	if len(rows) != 2 {
		t.Fatalf("rows %+v, want the two entries", rows)
	}
	for _, f := range rows {
		if f.State != "quarantined" || f.Reason != "not_regular_file" || f.Worker != "w2" {
			t.Fatalf("row %+v, want held not_regular_file by w2", f)
		}
	}
	for _, w := range []string{"w-once", "w2"} {
		ents, err := os.ReadDir(filepath.Join(site.Root, "processing", w))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Fatalf("processing/%s still holds %v", w, ents)
		}
	}
	var held []os.FileMode
	for _, f := range rows {
		st, err := os.Lstat(filepath.Join(site.Root, filepath.FromSlash(f.Archive))) // the in-process site serves its Root as /
		if err != nil {
			t.Fatalf("intake %d is not in quarantine/: %v", f.ID, err)
		}
		held = append(held, st.Mode().Type())
	}
	if !slices.Contains(held, os.ModeDir) || !slices.Contains(held, os.ModeSymlink) {
		t.Fatalf("quarantine/ holds entries of types %v, want the directory and the symlink", held)
	}
	if k := kinds(w2.reconcile(t)); k[ledger.KindOrphanClaim] != 0 || k[ledger.KindQuarantineNoRecord] != 0 {
		t.Fatalf("findings by kind %v after the hold, want no entry without a row", k)
	}
	if b, _ := os.ReadFile(secret); string(b) != "do not read" {
		t.Fatal("the symlink's target was touched")
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'hleft'`); n != 0 {
		t.Fatalf("%d rows applied from hostile entries", n)
	}
}
