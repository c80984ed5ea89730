package reconcile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Row 15 in manifest mode, on a streamed listing of ready/: a data file
// whose manifest is overdue (past stale_upload) is reported, whatever order
// the listing gives the files in; one beside its manifest, or not overdue
// yet, is not; manifests and half-uploaded entries are never reported.
func TestOverdueDataFilesWithoutManifestAreReported(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mani")
	site.Config.Readiness = partners.ReadinessManifest
	old := time.Now().Add(-partners.DefaultStaleUpload - time.Hour)
	put := func(name string, mtime time.Time) {
		t.Helper()
		p := filepath.Join(site.Root, "ready", name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := 0; i < 40; i++ { // enough files that the listing mixes data files and manifests
		name := fmt.Sprintf("orders-%02d.csv", i)
		switch i % 4 { // created in both orders: listings follow creation order on some file systems
		case 0:
			put(name, old)
			put(name+partners.ManifestSuffix, old)
		case 2:
			put(name+partners.ManifestSuffix, old)
			put(name, old)
		default:
			put(name, old)
			want = append(want, filepath.Join(site.Config.SFTP.Root, "ready", name))
		}
	}
	put("orders-fresh.csv", time.Now()) // its manifest may still come
	put("orders-up.csv.part", old)
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	var got []string
	for _, f := range w1.reconcile(t) {
		if f.Kind == ledger.KindUnclaimableReady {
			if f.Detail != "not claimed: "+string(reason.ManifestMissing) {
				t.Fatalf("finding %+v", f)
			}
			got = append(got, f.Path)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if len(got) != len(want) {
		t.Fatalf("reported %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("reported %q, want %q", got, want)
		}
	}
}

// Row 15 under readiness stable: a file under an upload tool's temporary
// name (stable.ignore) is an upload in progress, not an unclaimable entry;
// one untouched past stale_upload is an abandoned upload (stale_upload),
// as row 14 says of incoming/.
func TestAbandonedTemporaryNamesInStableModeAreStaleUploads(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "stab")
	site.Config.Readiness = partners.ReadinessStable
	site.Config.Stable = partners.Stable{StableFor: time.Hour}
	old := time.Now().Add(-partners.DefaultStaleUpload - time.Hour)
	for name, mtime := range map[string]time.Time{"orders-1.csv.filepart": old, "orders-2.csv.tmp": time.Now()} {
		p := filepath.Join(site.Root, "ready", name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	var got []string
	for _, f := range w1.reconcile(t) {
		if f.Kind == ledger.KindUnclaimableReady {
			t.Fatalf("an ignored name reported as unclaimable: %+v", f)
		}
		if f.Kind == ledger.KindStaleUpload {
			got = append(got, f.Path)
		}
	}
	if want := filepath.Join(site.Config.SFTP.Root, "ready", "orders-1.csv.filepart"); len(got) != 1 || got[0] != want {
		t.Fatalf("stale uploads %q, want only %q", got, want)
	}
}
