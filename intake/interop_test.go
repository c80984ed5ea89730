package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// interopProfiles is what each partner server the tests start is
// measured to be. rclone's SFTP server is pkg/sftp's, which offers
// posix-rename, hardlink and statvfs whatever its backend (statvfs answers
// unsupported: rclone gives no handler for it); over :memory: its VFS
// keeps directories and set mtimes while the process lives. Every server
// started 8 channels on one connection, the probe's cap (sshd's
// MaxSessions here is 50).
var interopProfiles = map[string]partners.Profile{
	testenv.ServerOpenSSH: {
		PosixRename: true, Hardlink: true, Fsync: true, StatVFS: true, EmptyDirPersists: true, MtimeStep: time.Second, RealPath: true,
		MaxRead: 255 << 10, Handles: 64, Channels: 8},
	testenv.ServerProFTPD: {
		PosixRename: true, Hardlink: true, Fsync: true, StatVFS: true, EmptyDirPersists: true, MtimeStep: time.Second, RealPath: true,
		MaxRead: 256 << 10, Handles: 64, Channels: 8},
	testenv.ServerRcloneLocal: {RenameOverwrites: true,
		PosixRename: true, Hardlink: true, StatVFS: true, StatVFSFails: true, EmptyDirPersists: true, MtimeStep: time.Second, RealPath: true,
		MaxRead: 32 << 10, Handles: 64, Channels: 8},
	testenv.ServerRcloneMemory: {RenameOverwrites: true,
		PosixRename: true, Hardlink: true, StatVFS: true, StatVFSFails: true, EmptyDirPersists: true, MtimeStep: time.Second, RealPath: true,
		MaxRead: 32 << 10, Handles: 64, Channels: 8},
}

// Partners run servers nobody here wrote. On each server the tests start
// from its Debian package (OpenSSH, ProFTPD mod_sftp, rclone serve sftp
// over a local directory and over its in-memory object store), intake
// check (sftpconn.Probe) and the daemon's first poll measure the same
// profile (the daemon's kept in PostgreSQL) and both accept the site
// (rclone's RENAME overwrites: its sessions make sure of each target
// themselves). Then a file published by RENAME lands and is archived with
// its receipt in reports/, an identical resend is a duplicate with its own
// receipt, small files dropped together land as a group, bad rows are listed in a rejects report, a conflicting resend
// is quarantined and, released by ops, applied; on a site of its own, a
// claim whose row was lost (the rename's reply lost, the daemon stopped)
// is recorded and landed by the restarted daemon; and on another, an
// agreeing manifest pair lands and a disagreeing one is held.
func TestEveryPartnerServerRunsTheEndToEndProtocol(t *testing.T) {
	defer intake.SetScanCheckBytes(0)() // a resend is not scanned: its batch is held
	for _, srv := range testenv.Servers() {
		want, ok := interopProfiles[srv.Name]
		if !ok {
			t.Fatalf("server %s has no expectation here", srv.Name)
		}
		t.Run(srv.Name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := srv.NewSite(t, "iop")
			site.Drop(t, "orders-1.csv", goodRows("A", 3))
			cfg := site.Validated(t)
			checked, checkErr := sftpconn.Probe(context.Background(), &cfg, "w1")
			r := newRig(t, pool, "w1", site)
			runErr := r.d.PollOnce(context.Background(), "iop")
			if checkErr != nil || runErr != nil {
				t.Fatalf("check: %v; run: %v; want both to accept the site", checkErr, runErr)
			}
			stored, err := ledger.New(pool, 0).SiteProfile(context.Background(), "iop")
			if err != nil || stored == nil {
				t.Fatalf("the daemon kept no profile: %v", err)
			}
			// the daemon measures all but the limits, which check alone
			// measures (they cost a transfer each way)
			unlimited := want
			unlimited.MaxRead, unlimited.Handles, unlimited.Channels = 0, 0, 0
			if checked != want || stored.Profile != unlimited {
				t.Fatalf("check measured %s\nthe daemon %s\nwant %s", checked, stored.Profile, want)
			}
			interopRenameReadiness(t, r, site)
		})
		t.Run(srv.Name+"/crash mid-claim", func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := srv.NewSite(t, "iopc")
			interopCrashMidClaim(t, pool, site)
		})
		t.Run(srv.Name+"/manifest", func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := srv.NewSite(t, "iopm")
			site.Config.Readiness = partners.ReadinessManifest
			r := newRig(t, pool, "w1", site)
			interopManifest(t, r, site)
		})
	}
}

// interopReceipt reads the receipt at the remote path p and checks it is
// in reports/.
func interopReceipt(t *testing.T, s *testenv.Site, p string) sitefile.Receipt {
	t.Helper()
	rel := s.Rel(t, p)
	if !slices.Contains(s.Files(t, "reports"), strings.TrimPrefix(rel, "reports/")) {
		t.Fatalf("receipt %s is not in reports/ (%v)", rel, s.Files(t, "reports"))
	}
	var rc sitefile.Receipt
	if err := json.Unmarshal([]byte(s.Read(t, rel)), &rc); err != nil {
		t.Fatalf("receipt %s: %v", rel, err)
	}
	return rc
}

func interopRenameReadiness(t *testing.T, r *rig, site *testenv.Site) {
	pool := r.pool
	// the file dropped before the first poll: landed and archived
	fs := files(t, pool, "iop")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 3 {
		t.Fatalf("got %+v, want the file archived with 3 rows", fs)
	}
	if rc := interopReceipt(t, site, fs[0].Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Applied != 3 || rc.IntakeID != fs[0].ID {
		t.Fatalf("receipt %+v", rc)
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ still holds %v", got)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	arch := site.Files(t, "archive")
	if len(arch) != 1 || site.Read(t, path.Join("archive", arch[0])) != goodRows("A", 3) {
		t.Fatalf("archive holds %v, want the file's bytes once", arch)
	}

	// the same bytes again: a duplicate, nothing applied, its own receipt
	site.Drop(t, "orders-1.csv", goodRows("A", 3))
	r.poll("iop")
	fs = files(t, pool, "iop")
	if len(fs) != 2 || fs[1].State != "duplicate" {
		t.Fatalf("got %+v, want the resend a duplicate", fs)
	}
	if rc := interopReceipt(t, site, fs[1].Receipt); rc.Outcome != ledger.OutcomeDuplicate || rc.DuplicateOf != fs[0].ID {
		t.Fatalf("duplicate receipt %+v", rc)
	}
	if fs[1].Receipt == fs[0].Receipt {
		t.Fatal("the duplicate's receipt replaced the original's")
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'iop' AND last_intake_id = $1`, fs[0].ID); n != 3 {
		t.Fatalf("%d rows still carry the original intake, want 3", n)
	}
	if got := site.Files(t, "archive"); len(got) != 2 {
		t.Fatalf("archive holds %v, want both files (never overwritten)", got)
	}

	// small files dropped together: claimed, applied and archived as a
	// group, each with its own receipt
	for i := 1; i <= 3; i++ {
		site.Drop(t, fmt.Sprintf("orders-g%d.csv", i), goodRows(fmt.Sprintf("G%d", i), 2))
	}
	r.poll("iop")
	fs = files(t, pool, "iop")
	if len(fs) != 5 {
		t.Fatalf("got %+v, want the three small files beside the first two", fs)
	}
	for _, f := range fs[2:] {
		if f.State != "archived" || f.Applied != 2 {
			t.Fatalf("small file %+v, want archived with 2 rows", f)
		}
		if rc := interopReceipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.IntakeID != f.ID {
			t.Fatalf("receipt %+v of %+v", rc, f)
		}
	}
	if got := site.Files(t, "archive"); len(got) != 5 {
		t.Fatalf("archive holds %v, want 5 files", got)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Grouped.WithLabelValues("iop", "grouped")); got != 3 {
		t.Fatalf("%v files taken through a group, want 3", got)
	}

	// bad rows: the rest lands, a rejects report lists them
	site.Drop(t, "orders-rej.csv", header+
		"R-1,a@example.com,10.00,paid,2026-11-01T10:00:00Z,1\n"+
		"R-2,not-an-email,10.00,paid,2026-11-01T10:00:00Z,1\n"+
		"R-3,b@example.com,10.00,lost,2026-11-01T10:00:00Z,1\n"+
		"R-4,c@example.com,10.00,new,2026-11-01T10:00:00Z,1\n"+
		"R-5,d@example.com,10.00,new,2026-11-01T10:00:00Z,1\n")
	r.poll("iop")
	fs = files(t, pool, "iop")
	if len(fs) != 6 || fs[5].State != "archived" || fs[5].Applied != 3 || fs[5].Rejected != 2 || fs[5].Rejects == "" {
		t.Fatalf("got %+v, want archived with 3 applied and 2 rejected", fs)
	}
	if got, want := site.Read(t, site.Rel(t, fs[5].Rejects)), "line,column,reason,outcome,detail\n3,email,bad_email,rejected,\n4,status,not_in_enum,rejected,\n"; got != want {
		t.Fatalf("rejects report:\n%s\nwant:\n%s", got, want)
	}
	if rc := interopReceipt(t, site, fs[5].Receipt); rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Rejected != 2 {
		t.Fatalf("receipt %+v", rc)
	}

	// other bytes under a batch already applied: quarantined, never
	// applied, until ops release them
	changed := strings.Replace(goodRows("A", 3), "30.03", "99.99", 1)
	site.Drop(t, "orders-1.csv", changed)
	r.poll("iop")
	fs = files(t, pool, "iop")
	if len(fs) != 7 || fs[6].State != "quarantined" || fs[6].Reason != "batch_conflict" {
		t.Fatalf("got %+v, want the resend quarantined as batch_conflict", fs)
	}
	held := site.Files(t, "quarantine")
	if len(held) != 2 {
		t.Fatalf("quarantine holds %v, want the file and its reason", held)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'iop' AND amount = 99.99`); n != 0 {
		t.Fatal("the held bytes were applied")
	}
	if err := ops.Release(context.Background(), pool, ops.Decision{IntakeID: fs[6].ID, Actor: "alice", Reason: "the new file is right",
		Winner: ops.WinnerNew, Partners: []string{"iop"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	r.reconcileOnce(site)
	r.poll("iop")
	fs = files(t, pool, "iop")
	if fs[6].State != "archived" || fs[6].Applied != 1 {
		t.Fatalf("got %+v, want the released file archived with its one changed row", fs[6])
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'iop' AND amount = 99.99 AND last_intake_id = $1`, fs[6].ID); n != 1 {
		t.Fatal("the released bytes were not applied")
	}
	if got := site.Files(t, "quarantine"); slices.ContainsFunc(got, func(n string) bool { return !strings.HasSuffix(n, ".json") }) {
		t.Fatalf("quarantine still holds the released file: %v", got)
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ still holds %v", got)
	}
}

func interopManifest(t *testing.T, r *rig, site *testenv.Site) {
	pool := r.pool
	good, bad := goodRows("M", 3), goodRows("X", 3)
	site.Drop(t, "orders-m1.csv", good)
	r.poll("iopm")
	if fs := files(t, pool, "iopm"); len(fs) != 0 {
		t.Fatalf("a data file without its manifest was claimed: %+v", fs)
	}
	site.Drop(t, "orders-m1.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q, "rows": 3}`, len(good), sha(good)))
	site.Drop(t, "orders-m2.csv", bad)
	site.Drop(t, "orders-m2.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(bad), sha("something else")))
	r.poll("iopm")
	byName := map[string]fileRow{}
	for _, f := range files(t, pool, "iopm") {
		byName[f.Name] = f
	}
	if f := byName["orders-m1.csv"]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("agreeing pair: %+v, want archived with 3 applied", f)
	}
	if f := byName["orders-m2.csv"]; f.State != "quarantined" || f.Reason != "manifest_mismatch" {
		t.Fatalf("disagreeing pair: %+v, want quarantined manifest_mismatch", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'iopm' AND order_id LIKE 'X-%'`); n != 0 {
		t.Fatal("rows of the mismatching file were applied")
	}
	if arch := site.Files(t, "archive"); len(arch) != 2 {
		t.Fatalf("archive holds %v, want the data file and its manifest", arch)
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ still holds %v", got)
	}
}

func interopCrashMidClaim(t *testing.T, pool *pgxpool.Pool, site *testenv.Site) {
	site.Drop(t, "orders-c.csv", goodRows("C", 3))
	first := newRig(t, pool, "w1", site)
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	if err := first.d.PollOnce(context.Background(), "iopc"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected loss after the claim's rename", err)
	}
	fault.Set("")
	first.d.Stop()
	if got := site.Files(t, "processing"); len(got) != 1 || len(files(t, pool, "iopc")) != 0 {
		t.Fatalf("processing/ holds %v with %d rows, want the claimed file without a row", got, len(files(t, pool, "iopc")))
	}
	second := newRig(t, pool, "w1", site) // the same worker id, started again
	second.poll("iopc")
	fs := files(t, pool, "iopc")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("after the restart's first poll: %+v, want the claim recorded and archived", fs)
	}
	testenv.AssertExactOrders(t, pool, "iopc", 3, "C")
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	if rc := interopReceipt(t, site, fs[0].Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.IntakeID != fs[0].ID {
		t.Fatalf("receipt %+v", rc)
	}
}
