package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
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
	// the tree's real name, which the server's REALPATH gives, holds a
	// terminal escape: the refusal quotes it inert
	hostile := a.Root + "\x1b[31m"
	if err := os.Rename(a.Root, hostile); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostile, a.Root); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, pool, "w1", a, b)
	ctx := context.Background()
	r.poll("tree-a") // alone so far: polled
	a.Drop(t, "orders-1.csv", goodRows("T", 2))
	for _, id := range []string{"tree-b", "tree-a"} {
		err := r.d.PollOnce(ctx, id)
		if err == nil || !strings.Contains(err.Error(), "site_shared") {
			t.Fatalf("poll %s: %v, want it refused (site_shared)", id, err)
		}
		if strings.Contains(err.Error(), "\x1b") || !strings.Contains(err.Error(), `\x1b[31m"`) {
			t.Fatalf("poll %s: %q, want the server's path quoted with its escape made inert", id, err)
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
// store gateways, rclone serve sftp) is measured when the daemon first
// dials the partner (kept in PostgreSQL) and served, as intake check
// passes it: its sessions make sure of each rename's target themselves.
// With readiness stable, which puts changed files back into ready/ where
// the partner publishes, it is refused by both alike (rename_overwrites)
// and nothing is taken; on a server whose RENAME refuses, both serve it.
func TestAServerWhoseRenameOverwritesIsServedUnlessReadinessStable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		overwrites bool
		readiness  string
		served     bool
	}{
		{"overwrites, readiness rename", true, partners.ReadinessRename, true},
		{"overwrites, readiness stable", true, partners.ReadinessStable, false},
		{"refuses, readiness stable", false, partners.ReadinessStable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			srv, site := testenv.NewInProcessSite(t, "ow")
			if tc.overwrites {
				srv.RenameOverwrites()
			}
			site.Config.Readiness = tc.readiness
			site.Drop(t, "orders-1.csv", goodRows("O", 2))
			cfg := site.Validated(t)
			_, checkErr := sftpconn.Probe(context.Background(), &cfg, "w1")
			r := newRig(t, pool, "w1", site)
			err := r.d.PollOnce(context.Background(), "ow")
			var measured bool
			if qerr := pool.QueryRow(context.Background(), `SELECT rename_overwrites FROM intake_site_profile WHERE partner_id = 'ow'`).Scan(&measured); qerr != nil || measured != tc.overwrites {
				t.Fatalf("profile recorded %v (%v), want rename_overwrites %v", measured, qerr, tc.overwrites)
			}
			if tc.served {
				if err != nil || checkErr != nil {
					t.Fatalf("poll %v, check %v: want both to pass", err, checkErr)
				}
				if tc.readiness == partners.ReadinessStable {
					return // a first sighting: stable readiness claims on a later poll
				}
				if fs := files(t, pool, "ow"); len(fs) != 1 || fs[0].State != "archived" {
					t.Fatalf("rows %+v, want the file archived", fs)
				}
				testenv.AssertExactOrders(t, pool, "ow", 2, "O")
				return
			}
			if !errors.Is(checkErr, partners.ErrRenameOverwrites) {
				t.Fatalf("check: %v, want it refused", checkErr)
			}
			if err == nil || !errors.Is(err, partners.ErrRenameOverwrites) || !strings.Contains(err.Error(), "rename_overwrites") {
				t.Fatalf("poll: %v, want it refused as check refuses it", err)
			}
			if fs := files(t, pool, "ow"); len(fs) != 0 {
				t.Fatalf("rows %+v: a file was taken from a partner its server cannot serve", fs)
			}
			if got := site.Files(t, "ready"); len(got) != 1 {
				t.Fatalf("ready/ holds %v, want the file untouched", got)
			}
		})
	}
}

// On a server whose RENAME overwrites, a claim never replaces a file
// intake claimed before. A file whose plan awaits approval keeps its path
// in processing/; the partner sends the same name again with other bytes.
// On OpenSSH the new file's RENAME onto that path fails and the new file
// waits in ready/; on a server whose RENAME would replace the waiting
// file, the session's own check does the same: the waiting file keeps its
// bytes, and once it is approved and lands, the new file is claimed under
// an intake of its own (the same batch with other bytes: held as a batch
// conflict, its bytes in quarantine/).
func TestAClaimNeverReplacesAClaimedFileOnAServerWhoseRenameOverwrites(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "ow")
	srv.RenameOverwrites()
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	const name = "orders-x.csv"
	first, second := goodRows("A", 3), goodRows("B", 2)
	site.Drop(t, name, first)
	r := newRig(t, pool, "w1", site)
	r.poll("ow")
	fs := files(t, pool, "ow")
	if len(fs) != 1 || fs[0].State != "awaiting_approval" {
		t.Fatalf("rows %+v, want the file awaiting approval", fs)
	}
	site.Drop(t, name, second)
	r.poll("ow")
	if got := site.Read(t, "processing/w1/"+name); got != first {
		t.Fatalf("the waiting file's claimed path holds %q, want its own bytes", got)
	}
	if got := site.Read(t, "ready/"+name); got != second {
		t.Fatalf("ready/ holds %q, want the new file waiting", got)
	}
	if fs := files(t, pool, "ow"); len(fs) != 1 {
		t.Fatalf("rows %+v: the new file was claimed onto the waiting one's path", fs)
	}

	v, _, err := ops.PlanPage(context.Background(), pool, fs[0].ID, []string{"ow"}, ledger.ChangeFilter{}, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := approve(context.Background(), pool, "ow", fs[0].ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("ow")
	r.poll("ow")
	fs = files(t, pool, "ow")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "quarantined" || fs[1].Reason != "batch_conflict" {
		t.Fatalf("rows %+v, want the first archived and the new file held as a batch conflict", fs)
	}
	testenv.AssertExactOrders(t, pool, "ow", 3, "A")
	if got := site.Read(t, site.Rel(t, fs[0].Archive)); got != first {
		t.Fatalf("the first intake's archive holds %q, want its own bytes", got)
	}
	if got := site.Read(t, site.Rel(t, fs[1].Archive)); got != second {
		t.Fatalf("the held intake's file holds %q, want the new file's bytes", got)
	}
}

// A profile kept before the profile measured more than RENAME (its other
// columns NULL) is measured again at the daemon's first dial, though a
// day has not passed: status then shows the server whole.
func TestAProfileMeasuredInPartIsMeasuredAgain(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "part")
	r := newRig(t, pool, "w1", site)
	r.poll("part")
	execArgs(t, pool, `UPDATE intake_site_profile SET posix_rename = NULL, hardlink = NULL, fsync = NULL, statvfs = NULL,
		empty_dir_persists = NULL, mtime_step_ms = NULL, case_insensitive = NULL, realpath = NULL,
		measured_at = now() - interval '1 hour' WHERE partner_id = 'part'`)
	r.d.Stop()
	newRig(t, pool, "w1", site).poll("part") // a restart: the site is resolved afresh
	var realpath, fsync *bool
	var step *int32
	var age time.Duration
	if err := pool.QueryRow(context.Background(), `SELECT realpath, fsync, mtime_step_ms, now() - measured_at FROM intake_site_profile WHERE partner_id = 'part'`).
		Scan(&realpath, &fsync, &step, &age); err != nil {
		t.Fatal(err)
	}
	if realpath == nil || !*realpath || fsync == nil || !*fsync || step == nil || *step != 1000 || age > time.Minute {
		t.Fatalf("realpath %v, fsync %v, mtime step %v ms, measured %v ago: want OpenSSH's profile measured again now", realpath, fsync, step, age)
	}
}

// On a server whose directories exist only while they hold something (an
// object store's gateway: a directory is a prefix), ready/, processing/,
// archive/, quarantine/ and reports/ come and go as files do. The
// profile says so, and intake check's probes serve the site as the
// daemon does; a poll that finds ready/ gone finds nothing to claim
// (not a fault of the partner's); files land, a resend is a duplicate, a
// held file is held with its reason file and receipt, over several polls
// that each leave the directories empty; and the reconciler finds nothing
// for a human but the held file.
func TestAServerWhoseEmptyDirectoriesVanishIsServed(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "vanish")
	srv.EmptyDirsVanish()
	drop := func(name, body string) {
		t.Helper()
		dir := filepath.Join(site.Root, "ready")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"incoming", "ready"} {
		os.Remove(filepath.Join(site.Root, d)) // empty: gone, as the server has them
	}
	// intake check's probes agree with the daemon: the site is served
	cfg := site.Validated(t)
	if prof, err := sftpconn.Probe(context.Background(), &cfg, "w-check"); err != nil || prof.EmptyDirPersists {
		t.Fatalf("probe: %v, %+v; want the site served, its empty directories vanishing", err, prof)
	}
	if a, err := sftpconn.ProbeAccess(context.Background(), &cfg, true); err != nil || a.List != partners.CanYes {
		t.Fatalf("access probe: %v, %+v", err, a)
	}
	r := newRig(t, pool, "w1", site)
	r.poll("vanish") // nothing there yet: no ready/ at all
	var prof bool
	if err := pool.QueryRow(context.Background(), `SELECT empty_dir_persists FROM intake_site_profile LIMIT 1`).Scan(&prof); err != nil {
		t.Fatalf("site profile: %v", err)
	}
	if prof {
		t.Fatal("the profile says empty directories persist")
	}
	drop("orders-1.csv", goodRows("V", 3))
	r.poll("vanish")
	drop("orders-1.csv", goodRows("V", 3)) // the same bytes again
	r.poll("vanish")
	drop("orders-2.csv", testenv.OrdersHeader+strings.Repeat("bad,line\n", 5))
	r.poll("vanish")
	drop("orders-3.csv", goodRows("W", 2))
	r.poll("vanish")
	got := map[string]string{}
	for _, f := range files(t, pool, "vanish") {
		got[f.Name] += f.State + " "
	}
	want := map[string]string{"orders-1.csv": "archived duplicate ", "orders-2.csv": "quarantined ", "orders-3.csv": "archived "}
	for name, st := range want {
		if got[name] != st {
			t.Fatalf("files %v, want %v", got, want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'vanish'`); n != 5 {
		t.Fatalf("%d rows landed, want 5 (3 of V, 2 of W)", n)
	}
	if q := site.Files(t, "quarantine"); len(q) != 2 {
		t.Fatalf("quarantine/ holds %v, want the held file and its reason file", q)
	}
	receipts := 0
	for _, n := range site.Files(t, "reports") {
		if strings.HasSuffix(n, sitefile.ReceiptSuffix) {
			receipts++
		}
	}
	if receipts != 4 {
		t.Fatalf("reports/ holds %d receipts, want 4", receipts)
	}
	for _, f := range reconcileAs(t, pool, "w1", site) {
		if f.NeedsHuman && f.Kind != ledger.KindQuarantined { // the held file waits for ops, as it should
			t.Fatalf("the reconciler needs a human: %+v", f)
		}
	}
}

// On a server that compares names without case (its profile says so),
// two names that differ only by case are one name: their batch ids are
// folded, so the same bytes under the other case are a duplicate, also
// when both come in one poll (never grouped as two batches), and other
// bytes under it are the batch's conflict. On a server that tells case
// apart, the same two names are two batches.
func TestNamesThatDifferOnlyByCaseAreOneOnACaseInsensitiveServer(t *testing.T) {
	for _, tc := range []struct {
		name        string
		insensitive bool
		want        map[string]string
	}{
		// the pair of one poll: whichever binds the batch first is
		// archived, the other a duplicate
		{"case-insensitive", true, map[string]string{"pair": "archived duplicate", "orders-b2.csv": "archived", "orders-B2.csv": "quarantined"}},
		{"case-sensitive", false, map[string]string{"pair": "archived archived", "orders-b2.csv": "archived", "orders-B2.csv": "archived"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			srv, site := testenv.NewInProcessSite(t, "nc")
			if tc.insensitive {
				srv.CaseInsensitiveStat()
			}
			r := newRig(t, pool, "w1", site)
			body := goodRows("NC", 3)
			site.Drop(t, "orders-A1.csv", body)
			site.Drop(t, "orders-a1.csv", body) // the same bytes, in the same poll
			r.poll("nc")
			site.Drop(t, "orders-b2.csv", goodRows("NB", 2))
			r.poll("nc")
			site.Drop(t, "orders-B2.csv", goodRows("NX", 2)) // other bytes under the other case
			r.poll("nc")
			got := map[string]string{}
			var pair []string
			for _, f := range files(t, pool, "nc") {
				got[f.Name] = f.State
				if strings.EqualFold(f.Name, "orders-a1.csv") {
					pair = append(pair, f.State)
				}
			}
			sort.Strings(pair)
			got["pair"] = strings.Join(pair, " ")
			for name, st := range tc.want {
				if got[name] != st {
					t.Fatalf("files %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// A profile measurement killed part way leaves its probe entries in the
// worker's processing dir; the worker's next look through its dir (after
// a start) removes them, and nothing else of the dir.
func TestAKilledMeasurementsProbeFilesAreRemoved(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "probe")
	own := filepath.Join(site.Root, "processing", "w1")
	if err := os.MkdirAll(filepath.Join(own, partners.ProbePrefix+"d-0a0b"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{partners.ProbePrefix + "a-0a0b", partners.ProbePrefix + "b-0a0b", ".someone-elses"} {
		if err := os.WriteFile(filepath.Join(own, name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	site.Drop(t, "orders-1.csv", goodRows("P", 2))
	r := newRig(t, pool, "w1", site)
	r.poll("probe")
	if got := site.Files(t, filepath.Join("processing", "w1")); len(got) != 1 || got[0] != ".someone-elses" {
		t.Fatalf("processing/w1 holds %v, want only the dotfile that is not a probe's", got)
	}
	if fs := files(t, pool, "probe"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("files %+v", fs)
	}
}

// The limits only intake check measures (the largest read, the handles,
// the channels one connection starts) are kept with the profile it
// records; the daemon's own measurement of the same site, a day later or
// of a row measured before whether each extension works was, keeps them
// (and measures the rest again); of another site it forgets them.
func TestTheLimitsCheckKeptOutliveTheDaemonsMeasurementOfTheSameSiteOnly(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "lim")
	cfg := site.Validated(t)
	prof, psite, err := sftpconn.ProbeSite(context.Background(), &cfg, "w1")
	if err != nil || prof.Channels != 8 || prof.Handles == 0 {
		t.Fatalf("check's probe: %v, %s", err, prof)
	}
	l := ledger.New(pool, 0)
	if err := l.RecordCheckedProfile(context.Background(), "lim", psite.Key(), prof); err != nil {
		t.Fatal(err)
	}
	execArgs(t, pool, `UPDATE intake_site_profile SET statvfs_fails = NULL, measured_at = now() - interval '2 days',
		limits_measured_at = now() - interval '2 days' WHERE partner_id = 'lim'`)
	r := newRig(t, pool, "w1", site)
	r.poll("lim")
	kept, err := l.SiteProfile(context.Background(), "lim")
	if err != nil || kept == nil {
		t.Fatal(err)
	}
	if !kept.Complete || time.Since(kept.MeasuredAt) > time.Hour || kept.Profile != prof || time.Since(kept.LimitsMeasuredAt) < 47*time.Hour {
		t.Fatalf("after the daemon's measurement of the same site: complete %v, measured %s ago, limits %s ago, %s; want %s measured again now, check's limits kept",
			kept.Complete, time.Since(kept.MeasuredAt), time.Since(kept.LimitsMeasuredAt), kept.Profile, prof)
	}
	r.d.Stop()
	execArgs(t, pool, `UPDATE intake_site_profile SET site = 'another server', measured_at = now() - interval '2 days' WHERE partner_id = 'lim'`)
	newRig(t, pool, "w1", site).poll("lim") // a restart: the site is resolved afresh
	if kept, err = l.SiteProfile(context.Background(), "lim"); err != nil || kept == nil {
		t.Fatal(err)
	}
	unlimited := prof
	unlimited.MaxRead, unlimited.Handles, unlimited.Channels = 0, 0, 0
	if kept.Profile != unlimited || !kept.LimitsMeasuredAt.IsZero() || kept.Site != psite.Key() {
		t.Fatalf("after the daemon's measurement of another site: %s, limits measured at %v, site %q; want no limits", kept.Profile, kept.LimitsMeasuredAt, kept.Site)
	}
}

// The channels one connection starts, measured by intake check and kept
// with the profile, bound the sessions the daemon puts on a connection
// (sftpconn.Conns.SetChannels) from the partner's profile on: on a site
// of 4 channels a connection (sshd MaxSessions 4), three partners on one
// account get a connection each, no channel refused; without the bound,
// the second partner's session joins the first's connection and the
// third's is refused there and dials again (two logins).
func TestTheDaemonPutsNoMoreSessionsOnAConnectionThanItsMeasuredChannelsAllow(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, err := sshdtest.StartChannels(4)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	l := ledger.New(pool, 0)
	var ss []*testenv.Site
	for _, id := range []string{"cha", "chb", "chc"} {
		root, err := srv.PartnerRoot(id)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"incoming", "ready"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		site := &testenv.Site{Root: root, Config: partners.Config{ID: id, Feeds: []partners.Feed{testenv.OrdersFeed()},
			SFTP: partners.SFTP{Address: srv.Addr, User: srv.User, PrivateKeyFile: srv.ClientKeyFile,
				KnownHostsFile: srv.KnownHostsFile, Root: root, DialTimeout: 10 * time.Second}}}
		cfg := site.Validated(t)
		prof, psite, err := sftpconn.ProbeSite(context.Background(), &cfg, "w1") // intake check
		if err != nil || prof.Channels != 4 {
			t.Fatalf("check's probe of %s: %v, %d channels a connection, want 4", id, err, prof.Channels)
		}
		if err := l.RecordCheckedProfile(context.Background(), id, psite.Key(), prof); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, site)
	}
	r := newRig(t, pool, "w1", ss...)
	for _, s := range ss {
		s.Drop(t, "orders-"+s.Config.ID+".csv", goodRows(s.Config.ID, 2))
		r.poll(s.Config.ID) // its session is kept open
	}
	if n := intake.SSHLogins(r.d); n != 3 {
		t.Fatalf("%d SSH logins for three partners on a site of 4 channels a connection, want 3 (one session a connection)", n)
	}
	for _, s := range ss {
		if fs := files(t, pool, s.Config.ID); len(fs) != 1 || fs[0].State != "archived" {
			t.Fatalf("partner %s: %+v, want its file archived", s.Config.ID, fs)
		}
	}
}

// On a gateway whose RENAME is a copy (AWS Transfer Family over S3: the
// renamed file is a new object, stamped with the time of the copy), the
// claimed file's mtime is not the listed one. The profile says so, and
// the claimed file is still known as the claim's own: each file lands
// once and is archived, nothing is taken for a second file, and nothing
// is left in processing/.
func TestAServerWhoseRenameStampsTheTimeOfTheCopyIsServed(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "copyrn")
	srv.RenameOverwrites()
	srv.RenameCopies()
	site.Config.GroupFiles = 1 // each file on its own: their stops below are each one's
	r := newRig(t, pool, "w1", site)
	old := time.Now().Add(-time.Hour)
	for i, body := range []string{goodRows("CA", 3), goodRows("CB", 2)} {
		p := filepath.Join(site.Root, "ready", fmt.Sprintf("orders-%d.csv", i+1))
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil { // an upload an hour ago
			t.Fatal(err)
		}
	}
	// the first file stops after its commit (a crash), the second after
	// its download: each is resumed from processing/ by the next poll,
	// which must know it for the claim's own file
	if err := fault.Set("apply:after_commit=error@1,spool:after=error@2"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := r.d.PollOnce(ctx, "copyrn"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("poll: %v, want the injected stop", err)
	}
	cancel()
	fault.Set("")
	r.poll("copyrn")
	r.poll("copyrn")
	var restamps *bool
	if err := pool.QueryRow(context.Background(), `SELECT rename_restamps_mtime FROM intake_site_profile WHERE partner_id = 'copyrn'`).Scan(&restamps); err != nil {
		t.Fatal(err)
	}
	if restamps == nil || !*restamps {
		t.Fatalf("profile: rename restamps mtime %v, want true measured", restamps)
	}
	got := map[string]string{}
	for _, f := range files(t, pool, "copyrn") {
		got[f.Name] += f.State + " "
	}
	if got["orders-1.csv"] != "archived " || got["orders-2.csv"] != "archived " || len(got) != 2 {
		t.Fatalf("files %v, want each archived once", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'copyrn'`); n != 5 {
		t.Fatalf("%d rows landed, want 5", n)
	}
	if left := site.Files(t, "processing/w1"); len(left) != 0 {
		t.Fatalf("processing/w1 holds %v, want nothing", left)
	}
	if a := site.Files(t, "archive"); len(a) == 0 {
		t.Fatal("nothing archived")
	}
}

// A server that holds at most two files of a session open at once (the
// profile's probes side by side hold five) is measured one probe at a
// time and served: small files in a group and each on its own land once,
// archived with their receipts. Files run side by side on one session may
// meet the bound (an OPEN refused): such a file leaves its group for the
// per-file path, or is retried on its backoff, never held for it.
func TestAServerThatBoundsASessionsOpenFilesIsServed(t *testing.T) {
	_, pool := testenv.DB(t)
	var sites []*testenv.Site
	for _, c := range []struct {
		id    string
		group int
	}{{"fewfd", 0}, {"fewfd1", 1}} { // grouped, and each file on its own
		srv, site := testenv.NewInProcessSite(t, c.id)
		srv.MaxHandles(2)
		if c.group > 0 {
			site.Config.GroupFiles = c.group
		}
		for i, body := range []string{goodRows("FA", 3), goodRows("FB", 2), goodRows("FC", 4)} {
			site.Drop(t, fmt.Sprintf("orders-%d.csv", i+1), body)
		}
		sites = append(sites, site)
	}
	r := newRig(t, pool, "w1", sites...)
	for _, site := range sites {
		id := site.Config.ID
		for range 5 {
			r.poll(id)
			if count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND state <> 'archived'`, id) == 0 {
				break
			}
			waitDue(t, pool, id)
		}
		fs := files(t, pool, id)
		if len(fs) != 3 {
			t.Fatalf("%s: files %+v, want three", id, fs)
		}
		for _, f := range fs {
			if f.State != "archived" || f.Receipt == "" {
				t.Fatalf("%s: file %+v, want archived with its receipt", id, f)
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, id); n != 9 {
			t.Fatalf("%s: %d rows landed, want 9", id, n)
		}
	}
}

// Where `intake check` measured that the server holds two files of a
// session open at most, a poll runs one of the partner's files at a time
// (a file's run holds two: its download and its receipt's temporary
// file), and none meets the bound: each lands at its first attempt.
func TestAPartnerRunsNoMoreFilesAtOnceThanItsServerHoldsOpen(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "fewh")
	srv.MaxHandles(2)
	site.Config.GroupFiles = 1               // each file on its own
	newRig(t, pool, "w1", site).poll("fewh") // the profile measured and kept
	if _, err := pool.Exec(context.Background(), `UPDATE intake_site_profile SET handles = 2, limits_measured_at = pg_catalog.now()
		WHERE partner_id = 'fewh'`); err != nil { // as intake check records it
		t.Fatal(err)
	}
	for i, body := range []string{goodRows("HA", 3), goodRows("HB", 2), goodRows("HC", 4), goodRows("HD", 1)} {
		site.Drop(t, fmt.Sprintf("orders-%d.csv", i+1), body)
	}
	newRig(t, pool, "w2", site).poll("fewh")
	fs := files(t, pool, "fewh")
	if len(fs) != 4 {
		t.Fatalf("files %+v, want four", fs)
	}
	for _, f := range fs {
		if f.State != "archived" {
			t.Fatalf("file %+v, want archived at the first poll", f)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'fewh' AND attempts > 0`); n != 0 {
		t.Fatalf("%d files were retried, want none", n)
	}
}
