package intake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
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

// A partner's server whose RENAME overwrites an existing target (object
// store gateways, some SFTP servers) breaks the claim (the RENAME is the
// claim) and the never-overwrite archive: the daemon measures it when it
// first dials the partner and refuses the partner, as intake check does
// (rename_overwrites): no file is taken. The same site served as OpenSSH
// serves it is polled, and the measurement is kept in PostgreSQL.
func TestAServerWhoseRenameOverwritesIsRefusedAsCheckRefusesIt(t *testing.T) {
	for _, overwrites := range []bool{true, false} {
		t.Run(map[bool]string{true: "overwrites", false: "refuses"}[overwrites], func(t *testing.T) {
			_, pool := testenv.DB(t)
			srv, site := testenv.NewInProcessSite(t, "ow")
			if overwrites {
				srv.RenameOverwrites()
			}
			site.Drop(t, "orders-1.csv", goodRows("O", 2))
			cfg := site.Validated(t)
			_, checkErr := partners.Probe(context.Background(), &cfg, "w1")
			r := newRig(t, pool, "w1", site)
			err := r.d.PollOnce(context.Background(), "ow")
			var measured bool
			if qerr := pool.QueryRow(context.Background(), `SELECT rename_overwrites FROM intake_site_profile WHERE partner_id = 'ow'`).Scan(&measured); qerr != nil || measured != overwrites {
				t.Fatalf("profile recorded %v (%v), want rename_overwrites %v", measured, qerr, overwrites)
			}
			if !overwrites {
				if err != nil || checkErr != nil {
					t.Fatalf("poll %v, check %v: want both to pass", err, checkErr)
				}
				if fs := files(t, pool, "ow"); len(fs) != 1 || fs[0].State != "archived" {
					t.Fatalf("rows %+v, want the file archived", fs)
				}
				return
			}
			if !errors.Is(checkErr, partners.ErrRenameOverwrites) {
				t.Fatalf("check: %v, want it refused", checkErr)
			}
			if err == nil || !errors.Is(err, partners.ErrRenameOverwrites) || !strings.Contains(err.Error(), "rename_overwrites") {
				t.Fatalf("poll: %v, want it refused as check refuses it", err)
			}
			if fs := files(t, pool, "ow"); len(fs) != 0 {
				t.Fatalf("rows %+v: a file was taken from a server whose RENAME overwrites", fs)
			}
			if got := site.Files(t, "ready"); len(got) != 1 {
				t.Fatalf("ready/ holds %v, want the file untouched", got)
			}
		})
	}
}
