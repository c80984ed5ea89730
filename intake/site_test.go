package intake_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Two partners configured on one tree under different spellings (here a
// symbolic link to the other's root; likewise "." and the home directory,
// or a host name and its address) would claim, archive and report in each
// other's directories. Their sites are resolved by the server (REALPATH)
// when first dialled: once both are known, both are refused (site_shared)
// and neither takes a file; the first, dialled alone, is refused from its
// next poll on.
func TestTwoPartnersOnOneTreeAreRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	a := testenv.NewSite(t, "tree-a")
	b := testenv.NewSite(t, "tree-b")
	alias := filepath.Join(filepath.Dir(a.Root), "alias-of-"+filepath.Base(a.Root))
	if err := os.Symlink(a.Root, alias); err != nil {
		t.Fatal(err)
	}
	b.Config.SFTP.Root = alias
	r := newRig(t, pool, "w1", a, b)
	ctx := context.Background()
	r.poll("tree-a") // alone so far: polled
	a.Drop(t, "orders-1.csv", goodRows("T", 2))
	for _, id := range []string{"tree-b", "tree-a"} {
		err := r.d.PollOnce(ctx, id)
		if err == nil || !strings.Contains(err.Error(), "site_shared") {
			t.Fatalf("poll %s: %v, want it refused (site_shared)", id, err)
		}
	}
	if fs := files(t, pool, "tree-a"); len(fs) != 0 {
		t.Fatalf("partner tree-a took %+v from a tree it shares", fs)
	}
	if fs := files(t, pool, "tree-b"); len(fs) != 0 {
		t.Fatalf("partner tree-b took %+v from a tree it shares", fs)
	}
	if got := a.Files(t, "ready"); len(got) != 1 {
		t.Fatalf("ready/ holds %v, want the file untouched", got)
	}
}
