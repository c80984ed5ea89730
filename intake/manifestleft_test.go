package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// An approved manifest file whose owner is gone is taken over by the
// partner's poller; the site refuses the move of its manifest once
// (the file itself moved): the file goes back beside its manifest, the
// row is pointed there, and the pair is applied and archived from where
// its owner left it. The manifest's failure was only logged: the file was
// archived from the taker's dir without its manifest, which stayed in the
// gone owner's dir for good.
func TestADecidedFileWhoseManifestCannotMoveRunsWhereItIs(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	srv, site := testenv.NewInProcessSite(t, "dmleft")
	site.Config.Readiness = partners.ReadinessManifest
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	r := newRig(t, pool, "w1", site)
	body := goodRows("D", 3)
	site.Drop(t, "orders-1.csv", body)
	site.Drop(t, "orders-1.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(body), sha(body)))
	r.poll("dmleft")
	f := files(t, pool, "dmleft")[0]
	if f.State != "awaiting_approval" {
		t.Fatalf("file %+v, want it awaiting approval", f)
	}
	v, _ := planOf(t, pool, "dmleft", f.ID)
	if err := approve(ctx, pool, "dmleft", f.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	r.d.Stop() // its owner is gone
	var refused atomic.Int32
	srv.RefuseRenames(func(from string) bool {
		return strings.HasSuffix(from, "/processing/w1/orders-1.csv.complete") && refused.Add(1) == 1
	})
	t.Cleanup(func() { srv.RefuseRenames(nil) })
	r2 := newRig(t, pool, "w2", site)
	r2.poll("dmleft")
	if refused.Load() == 0 {
		t.Fatal("the manifest's move was never tried")
	}
	f = files(t, pool, "dmleft")[0]
	if f.State != "archived" || f.Applied != 3 || f.Worker != "w2" {
		t.Fatalf("file %+v, want archived by w2 from where w1 left it", f)
	}
	// the in-process site serves its Root as /
	if _, err := os.Stat(filepath.Join(site.Root, filepath.FromSlash(f.Archive+partners.ManifestSuffix))); err != nil {
		t.Fatalf("the manifest is not beside the archived file: %v", err)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}
