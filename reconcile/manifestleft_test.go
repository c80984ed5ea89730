package reconcile_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
)

// takeover is a manifest partner on an in-process site whose file
// orders-m.csv and its manifest w1 claimed; w1's download stopped before
// the manifest's read, and its lease is over: w2's reconciler takes the
// file over next.
type takeover struct {
	srv  *sftpd.Server
	site *testenv.Site
	pool *pgxpool.Pool
	w2   *node
	id   int64
}

func manifestTakeover(t *testing.T, id string) *takeover {
	t.Helper()
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, id)
	site.Config.Readiness = partners.ReadinessManifest
	body := testenv.OrdersCSV("M", 5)
	sum := sha256.Sum256([]byte(body))
	site.Drop(t, "orders-m.csv", body)
	site.Drop(t, "orders-m.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(body), hex.EncodeToString(sum[:])))
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	w2 := newNode(t, pool, "w2", spoolDir, site)
	stoppedAt(t, w1, id, "download:manifest")
	fault.Set("")
	fs := testenv.Files(t, pool, id)
	if len(fs) != 1 || fs[0].State != "claimed" || fs[0].Worker != "w1" {
		t.Fatalf("rows %+v, want one file claimed by w1", fs)
	}
	if got := site.Files(t, "processing/w1"); len(got) != 2 {
		t.Fatalf("processing/w1 holds %v, want the file and its manifest", got)
	}
	expireLeases(t, pool)
	return &takeover{srv: srv, site: site, pool: pool, w2: w2, id: fs[0].ID}
}

// refuse has the site refuse the RENAMEs from the paths (relative to the
// site's root) until it is called again or the test ends.
func (tk *takeover) refuse(t *testing.T, rels ...string) {
	t.Helper()
	tk.srv.RefuseRenames(func(from string) bool {
		for _, rel := range rels {
			if strings.TrimPrefix(from, "/") == rel {
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { tk.srv.RefuseRenames(nil) })
}

// claimed is the file's claimed path.
func (tk *takeover) claimed(t *testing.T) string {
	t.Helper()
	var p string
	if err := tk.pool.QueryRow(context.Background(), `SELECT claimed_path FROM file_intake WHERE intake_id = $1`, tk.id).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// archived: w2 polls; the file is applied once and archived by w2 with
// its manifest beside it, and processing/ is empty.
func (tk *takeover) archived(t *testing.T, partner string) {
	t.Helper()
	if err := tk.w2.poll(t, partner); err != nil {
		t.Fatal(err)
	}
	fs := testenv.Files(t, tk.pool, partner)
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w2" || fs[0].Applied != 5 {
		t.Fatalf("rows %+v, want the file applied and archived by w2", fs)
	}
	// the in-process site serves its Root as /
	if _, err := os.Stat(filepath.Join(tk.site.Root, filepath.FromSlash(fs[0].Archive+partners.ManifestSuffix))); err != nil {
		t.Fatalf("the manifest is not beside the archived file: %v", err)
	}
	if got := tk.site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	testenv.AssertExactOrders(t, tk.pool, partner, 5, "M")
}

// A takeover whose move of the manifest fails while the manifest stays
// where it was (the site refuses to move it) takes the file back beside
// it and points the row there: the new owner checks the file against its
// manifest and applies it where the pair is. The manifest's failure was
// ignored: the row named the new owner's dir, where no manifest came, the
// file was held for good as manifest_invalid and the manifest stayed in
// the old owner's dir, which no look through processing/ reported.
func TestATakeoverThatCannotMoveTheManifestRunsThePairWhereItIs(t *testing.T) {
	tk := manifestTakeover(t, "mleft")
	tk.refuse(t, "processing/w1/orders-m.csv.complete")
	fs := tk.w2.reconcile(t)
	if k := kinds(fs); k[ledger.KindLeaseExpired] != 1 || reconcile.NeedHuman(fs) {
		t.Fatalf("findings %+v, want the file taken over, nothing for a human", fs)
	}
	if claimed := tk.claimed(t); !strings.HasSuffix(claimed, "/processing/w1/orders-m.csv") {
		t.Fatalf("the row points at %s, want the file beside its manifest in processing/w1/", claimed)
	}
	if got := tk.site.Files(t, "processing/w1"); len(got) != 2 {
		t.Fatalf("processing/w1 holds %v, want the file back beside its manifest", got)
	}
	tk.srv.RefuseRenames(nil)
	tk.archived(t, "mleft")
}

// A takeover that moves the file and can neither move its manifest nor
// take the file back beside it reports the manifest for a human; the
// next run's look through processing/ finds the manifest beside no file
// and moves it beside the file of the live row that names it, and the
// file is checked against it and applied. Both were left unsaid: the
// manifest stayed in the old owner's dir for good, and the file was held
// as manifest_invalid.
func TestAManifestLeftApartFromItsFileIsMovedBesideIt(t *testing.T) {
	tk := manifestTakeover(t, "mapart")
	tk.refuse(t, "processing/w1/orders-m.csv.complete", "processing/w2/orders-m.csv")
	fs := tk.w2.reconcile(t)
	k := kinds(fs)
	if k[ledger.KindLeaseExpired] != 1 || k[ledger.KindTakeoverBlocked] != 1 || !reconcile.NeedHuman(fs) {
		t.Fatalf("findings %+v, want the file taken over and its manifest left reported", fs)
	}
	for _, f := range fs {
		if f.Kind == ledger.KindTakeoverBlocked && (f.IntakeID != tk.id || !strings.HasSuffix(f.Path, "/processing/w1/orders-m.csv.complete")) {
			t.Fatalf("finding %+v, want intake %d's manifest in processing/w1/", f, tk.id)
		}
	}
	if got := tk.site.Files(t, "processing/w1"); len(got) != 1 || got[0] != "orders-m.csv.complete" {
		t.Fatalf("processing/w1 holds %v, want the manifest left there", got)
	}
	if claimed := tk.claimed(t); !strings.HasSuffix(claimed, "/processing/w2/orders-m.csv") {
		t.Fatalf("the row points at %s, want the file where it was moved", claimed)
	}
	tk.srv.RefuseRenames(nil)
	fs = tk.w2.reconcile(t)
	var moved bool
	for _, f := range fs {
		if f.Kind == ledger.KindOrphanClaim && f.IntakeID == tk.id && !f.NeedsHuman && strings.HasSuffix(f.Path, "/processing/w1/orders-m.csv.complete") {
			moved = true
		}
	}
	if !moved || reconcile.NeedHuman(fs) {
		t.Fatalf("findings %+v, want the manifest moved beside intake %d's file", fs, tk.id)
	}
	if got := tk.site.Files(t, "processing/w2"); len(got) != 2 || len(tk.site.Files(t, "processing/w1")) != 0 {
		t.Fatalf("processing/w2 holds %v, want the file and its manifest, and nothing left in processing/w1", got)
	}
	tk.archived(t, "mapart")
}

// A manifest in processing/ beside no file that no row looks for there
// (its file moved on without it, and its intake ended) is reported for a
// human and left where it is; a manifest whose row looks for it there
// under another name than its file's (a released file's) is not.
func TestAManifestBesideNoFileThatNoRowLooksForIsReported(t *testing.T) {
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "mstray")
	site.Config.Readiness = partners.ReadinessManifest
	gone := filepath.Join(site.Root, "processing", "w-gone")
	if err := os.MkdirAll(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"orders-z.csv.complete", "orders-r.csv", "7.orders-r.csv.complete"} {
		if err := os.WriteFile(filepath.Join(gone, f), []byte(`{"bytes": 1, "sha256": "00"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// the released file's row: awaiting approval, it owns its path and
	// looks for its manifest beside it under the held name
	if _, err := pool.Exec(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, manifest_name, state, worker_id, lease_until)
		VALUES ('mstray', 'orders', 'orders-r.csv', '/processing/w-gone/orders-r.csv', 28, '7.orders-r.csv.complete', 'awaiting_approval', 'w-gone', pg_catalog.now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	fs := w1.reconcile(t)
	var stray []ledger.Finding
	for _, f := range fs {
		if f.Kind == ledger.KindOrphanClaim {
			stray = append(stray, f)
		}
	}
	if len(stray) != 1 || !stray[0].NeedsHuman || stray[0].IntakeID != 0 || !strings.HasSuffix(stray[0].Path, "/processing/w-gone/orders-z.csv.complete") {
		t.Fatalf("findings %+v, want orders-z.csv.complete alone reported for a human", fs)
	}
	for _, f := range []string{"orders-z.csv.complete", "orders-r.csv", "7.orders-r.csv.complete"} {
		if _, err := os.Stat(filepath.Join(gone, f)); err != nil {
			t.Fatalf("%s was moved: %v", f, err)
		}
	}
}
