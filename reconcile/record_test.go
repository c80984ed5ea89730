package reconcile_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// claim: record on a read-only account (internal-sftp -R): the reconciler
// runs without writing on the site (no EnsureDirs, no moves), and takes
// an expired lease over without a move: the file stays in ready/ and the
// new owner finishes it from its row.
func TestRecordClaimLeaseIsTakenOverWithoutAMove(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, err := sshdtest.StartSFTP("-R")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root, err := srv.PartnerRoot("ro-rec")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "ready"), 0o755); err != nil {
		t.Fatal(err)
	}
	site := &testenv.Site{Root: root, Config: partners.Config{ID: "ro",
		SFTP: partners.SFTP{Address: srv.Addr, User: srv.User, PrivateKeyFile: srv.ClientKeyFile,
			KnownHostsFile: srv.KnownHostsFile, Root: root, DialTimeout: 10 * time.Second},
		Readiness: partners.ReadinessStable, Claim: partners.ClaimRecord,
		Stable: partners.Stable{StableFor: 10 * time.Millisecond, MinAge: time.Millisecond},
		Feeds:  []partners.Feed{testenv.OrdersFeed()}}}
	name := "orders-20261206.csv"
	old := time.Now().Add(-time.Hour)
	p := filepath.Join(root, "ready", name)
	if err := os.WriteFile(p, []byte(testenv.OrdersCSV("RL", 3)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	if err := w1.poll(t, "ro"); err != nil { // first sight
		t.Fatal(err)
	}
	testenv.WaitStable(t, pool, "ro", name, 10*time.Millisecond)
	withFault(t, "spool:after=error")
	if err := w1.poll(t, "ro"); err == nil {
		t.Fatal("the fault did not fire")
	}
	fault.Set("")
	fs := testenv.Files(t, pool, "ro")
	if len(fs) != 1 || fs[0].State != "spooled" {
		t.Fatalf("got %+v, want one spooled intake", fs)
	}
	expireLeases(t, pool)
	w2 := newNode(t, pool, "w2", t.TempDir(), site)
	found := w2.reconcile(t)
	if k := kinds(found); k[ledger.KindLeaseExpired] != 1 || k[ledger.KindRemoteMissing] != 0 || len(found) != 1 {
		t.Fatalf("findings %+v, want one lease_expired", found)
	}
	if err := w2.poll(t, "ro"); err != nil {
		t.Fatal(err)
	}
	fs = testenv.Files(t, pool, "ro")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w2" || fs[0].Applied != 3 {
		t.Fatalf("got %+v, want the file archived by w2", fs)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Fatalf("the site holds %d entries, want ready/ alone", len(ents))
	}

	// a held file of such a site, released by ops (the new bytes win):
	// reopened at its place in ready/, taken over without a move, applied
	if err := os.WriteFile(p, []byte(testenv.OrdersCSV("RN", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, old.Add(time.Minute), old.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := w2.poll(t, "ro"); err != nil { // first sight
		t.Fatal(err)
	}
	testenv.WaitStable(t, pool, "ro", name, 10*time.Millisecond)
	if err := w2.poll(t, "ro"); err != nil { // stable
		t.Fatal(err)
	}
	fs = testenv.Files(t, pool, "ro")
	if len(fs) != 2 || fs[1].State != "quarantined" || fs[1].Reason != "batch_conflict" {
		t.Fatalf("got %+v, want the rewritten file held as batch_conflict", fs)
	}
	if err := ops.Release(context.Background(), pool, ops.Decision{IntakeID: fs[1].ID, Actor: "alice", Reason: "the new file is right",
		Winner: ops.WinnerNew, Partners: []string{"ro"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	w2.reconcile(t) // takes the released row over
	if err := w2.poll(t, "ro"); err != nil {
		t.Fatal(err)
	}
	fs = testenv.Files(t, pool, "ro")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Applied != 2 {
		t.Fatalf("got %+v, want the released file archived with its 2 rows", fs)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ro' AND order_id LIKE 'RN-%'`); n != 2 {
		t.Fatalf("%d rows of the released file, want 2", n)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Fatalf("the site holds %d entries after the release, want ready/ alone", len(ents))
	}
}
