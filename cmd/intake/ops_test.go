package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

func TestOpsReviewReleasesDiscardsReplaysAndAudits(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "ops")
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "ops-1"})
	must := func(code int, out string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		return out
	}
	state := func(id int64) (st, reason string) {
		t.Helper()
		pool.QueryRow(context.Background(), `SELECT state, coalesce(reason,'') FROM file_intake WHERE intake_id = $1`, id).Scan(&st, &reason)
		return
	}
	process := func() {
		t.Helper()
		runCLI("reconcile", "--config", cfg) // takes released files over (exit 1 while others wait for ops)
		must(runCLI("run", "--config", cfg, "--once"))
	}

	// 1: too many rejected rows: held; released, the valid rows apply
	bad := testenv.OrdersHeader + "R-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1\nR-2,x,1.00,paid,2026-11-01T00:00:00Z,1\nR-3,y,1.00,paid,2026-11-01T00:00:00Z,1\n"
	site.Drop(t, "orders-r.csv", bad)
	// 2: a good file, later resent with other bytes: a batch conflict
	site.Drop(t, "orders-c.csv", testenv.OrdersCSV("C", 3))
	// 3: a file no feed matches: hostile, can only be discarded
	os.WriteFile(filepath.Join(site.Root, "ready", "notes.txt"), []byte("x"), 0o644)
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-c.csv", strings.ReplaceAll(testenv.OrdersCSV("C", 3), "paid", "shipped"))
	must(runCLI("run", "--config", cfg, "--once"))

	ids := map[string]int64{}
	for _, f := range testenv.Files(t, pool, "ops") {
		ids[f.Name+"/"+f.State] = f.ID
	}
	rej, conflict, hostile, orig := ids["orders-r.csv/quarantined"], ids["orders-c.csv/quarantined"], ids["notes.txt/quarantined"], ids["orders-c.csv/archived"]
	if rej == 0 || conflict == 0 || hostile == 0 || orig == 0 {
		t.Fatalf("files: %v", ids)
	}
	out := must(runCLI("quarantine", "list", "--config", cfg, "--open"))
	for _, w := range []string{"reject_rate_exceeded", "batch_conflict", "no_feed"} {
		if !strings.Contains(out, w) {
			t.Fatalf("list lacks %s:\n%s", w, out)
		}
	}
	id := func(n int64) string { return strconv.FormatInt(n, 10) }
	if code, out := runCLI("quarantine", "release", id(rej), "--config", cfg); code != 2 || !strings.Contains(out, "--reason TEXT is required") {
		t.Fatalf("a release without a reason: %d %s", code, out)
	}
	// a configuration for another partner can neither see nor decide on it
	other := writeConfigOpts(t, testenv.NewSite(t, "other"), cfgOpts{worker: "ops-2"})
	if out := must(runCLI("quarantine", "list", "--config", other)); strings.Contains(out, "reject_rate_exceeded") {
		t.Fatalf("another partner's config lists ops' files:\n%s", out)
	}
	// the hold each decision names, as show prints it
	hold := func(n int64) string {
		t.Helper()
		out := must(runCLI("quarantine", "show", id(n), "--config", cfg))
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "hold" {
				return f[1]
			}
		}
		t.Fatalf("show prints no hold:\n%s", out)
		return ""
	}
	if code, out := runCLI("quarantine", "release", id(rej), "--hold", hold(rej), "--config", other, "--reason", "x", "--actor", "mallory"); code != exitRefused || !strings.Contains(out, "not held") {
		t.Fatalf("another partner's config released it: %d %s", code, out)
	}
	if code, out := runCLI("quarantine", "release", id(rej), "--hold", hold(conflict), "--config", cfg, "--reason", "x", "--actor", "mallory"); code != exitRefused || !strings.Contains(out, "held again since hold") {
		t.Fatalf("a release naming another hold: %d %s", code, out)
	}
	must(runCLI("quarantine", "release", id(rej), "--hold", hold(rej), "--config", cfg, "--reason", "partner confirmed the two bad emails", "--actor", "alice"))
	if code, out := runCLI("quarantine", "release", id(conflict), "--hold", hold(conflict), "--config", cfg, "--reason", "x", "--actor", "bob"); code != exitRefused || !strings.Contains(out, "--winner") {
		t.Fatalf("a conflict released without a winner: %d %s", code, out)
	}
	must(runCLI("quarantine", "release", id(conflict), "--hold", hold(conflict), "--config", cfg, "--reason", "the resend is the correction", "--actor", "bob", "--winner", "new"))
	if code, out := runCLI("quarantine", "release", id(hostile), "--hold", hold(hostile), "--config", cfg, "--reason", "x", "--actor", "carol"); code != exitRefused || !strings.Contains(out, "only be discarded") {
		t.Fatalf("a hostile entry released: %d %s", code, out)
	}
	hostileHold := hold(hostile)
	must(runCLI("quarantine", "discard", id(hostile), "--hold", hostileHold, "--config", cfg, "--reason", "not ours", "--actor", "carol"))
	if code, out := runCLI("quarantine", "discard", id(hostile), "--hold", hostileHold, "--config", cfg, "--reason", "again", "--actor", "carol"); code != exitRefused || !strings.Contains(out, "was already discarded") {
		t.Fatalf("a second discard: %d %s", code, out)
	}
	process()

	if st, _ := state(rej); st != "archived" {
		t.Fatalf("released reject-rate file is %s", st)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ops' AND order_id LIKE 'R-%'`); n != 1 {
		t.Fatalf("%d R rows, want the 1 valid one", n)
	}
	if st, _ := state(conflict); st != "archived" {
		t.Fatalf("released conflict is %s", st)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ops' AND order_id LIKE 'C-%' AND status = 'shipped' AND last_intake_id = $1`, conflict); n != 3 {
		t.Fatalf("%d C rows carry the winning bytes, want 3", n)
	}
	if st, _ := state(hostile); st != "discarded" {
		t.Fatalf("discarded entry is %s", st)
	}
	if out := must(runCLI("quarantine", "show", id(conflict), "--config", cfg)); !strings.Contains(out, "released") || !strings.Contains(out, "bob") {
		t.Fatalf("show:\n%s", out)
	}

	// replay the first (now superseded) C file: idempotent, all rows held
	// back as conflicts with the newer intake; audited
	out = must(runCLI("replay", id(orig), "--config", cfg, "--reason", "mapping fix", "--actor", "dave"))
	if !strings.Contains(out, "archived, rows 0 applied, 0 unchanged, 0 rejected, 3 conflict") {
		t.Fatalf("a replay of superseded bytes must not overwrite the newer rows:\n%s", out)
	}
	if w := "acting as database user \"postgres\", actor \"dave\"\n"; !strings.Contains(out, w) {
		t.Errorf("replay said:\n%s\nwant it to say %q", out, w)
	}
	var replayed, rid int64
	pool.QueryRow(context.Background(), `SELECT count(*), max(intake_id) FROM file_intake WHERE replay_of = $1 AND state = 'archived'`, orig).Scan(&replayed, &rid)
	if replayed != 1 {
		t.Fatal("no archived replay")
	}
	out = must(runCLI("replay", id(rid), "--config", cfg, "--reason", "again", "--actor", "dave"))
	if !strings.Contains(out, "0 applied, 0 unchanged, 0 rejected, 3 conflict") {
		t.Fatalf("a replay of a replay is judged as the first:\n%s", out)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ops' AND order_id LIKE 'C-%' AND status = 'shipped'`); n != 3 {
		t.Fatal("a replay overwrote the newer rows")
	}
	// the winner's own bytes replayed: nothing changes
	out = must(runCLI("replay", id(conflict), "--config", cfg, "--reason", "check", "--actor", "dave"))
	if !strings.Contains(out, "0 applied, 3 unchanged") {
		t.Fatalf("replaying the current bytes must change nothing:\n%s", out)
	}
	// a replay whose commit's outcome is lost: the command cannot say
	// the rows are in, and its exit says so
	if err := fault.Set("commit:lost=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	code, out := runCLI("replay", id(conflict), "--config", cfg, "--reason", "check again", "--actor", "dave")
	fault.Set("")
	if code != exitUnknown || !strings.Contains(out, ": outcome_unknown (commit_unknown), rows") || !strings.Contains(out, "the next reconcile run reads the chunk ledger") {
		t.Fatalf("a replay whose commit's outcome was lost: exit %d, want %d\n%s", code, exitUnknown, out)
	}
	audit := must(runCLI("audit", "--config", cfg, "--partner", "ops"))
	for _, w := range []string{"alice", "release", "bob", "carol", "discard", "dave", "replay", "mapping fix"} {
		if !strings.Contains(audit, w) {
			t.Fatalf("audit lacks %q:\n%s", w, audit)
		}
	}
}

func TestPurgeRemovesOnlyWhatIsPastRetention(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "purge")
	spoolDir := t.TempDir()
	cfg := writeConfigOpts(t, site, cfgOpts{spool: spoolDir})
	// an archived file with a rejected row, and a conflict held for ops
	site.Drop(t, "orders-old.csv", testenv.OrdersCSV("O", 9)+"O-99,bad,1.00,paid,2026-11-01T00:00:00Z,1\n")
	must := func(code int, out string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		return out
	}
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-old.csv", testenv.OrdersCSV("N", 3))
	must(runCLI("run", "--config", cfg, "--once"))
	fs := testenv.Files(t, pool, "purge")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "quarantined" {
		t.Fatalf("files %+v", fs)
	}
	must(runCLI("quarantine", "show", strconv.FormatInt(fs[1].ID, 10), "--config", cfg))
	pool.Exec(context.Background(), `INSERT INTO intake_audit (actor, action, partner_id, reason, at) VALUES ('x', 'test', 'purge', 'old', now() - interval '500 days')`)
	pool.Exec(context.Background(), `UPDATE file_intake SET finished_at = now() - interval '100 days' WHERE intake_id = $1`, fs[0].ID)
	old := time.Now().Add(-100 * 24 * time.Hour)
	filepath.WalkDir(spoolDir, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			os.Chtimes(p, old, old)
		}
		return nil
	})
	for _, r := range site.Files(t, "reports") {
		if strings.Contains(r, "."+strconv.FormatInt(fs[0].ID, 10)+".") {
			os.Chtimes(filepath.Join(site.Root, "reports", r), old, old)
		}
	}
	// a sealed receipt of a PGP feed's file, as old (it was kept for good)
	sealed := filepath.Join(site.Root, "reports", "orders-pgp.77.receipt.json"+sitefile.EncryptedSuffix)
	if err := os.WriteFile(sealed, []byte("-----BEGIN PGP MESSAGE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(sealed, old, old)
	// plan changes of a file no longer waiting (values ops no longer
	// review) and of a file awaiting approval
	var waiting int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		    state, reason, worker_id, lease_until, content_sha256, plan_hash, planned_at)
		VALUES ('purge', 'orders', 'w.csv', 'processing/w1/w.csv', 10, 'awaiting_approval', 'awaiting_approval', 'w1', now(), 'cd34', 'h1', now())
		RETURNING intake_id`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{fs[0].ID, waiting} {
		if _, err := pool.Exec(context.Background(), `WITH c AS (INSERT INTO intake_plan_change (intake_id, seq, line, action, key, changed)
			    VALUES ($1, 2, 2, 'update', 'K-1', '{"qty": ["1", "2"]}'))
			INSERT INTO intake_plan_change_column (intake_id, col, seq) VALUES ($1, 'qty', 2)`, id); err != nil {
			t.Fatal(err)
		}
	}
	out := must(runCLI("purge", "--config", cfg))
	if n := testenv.Count(t, pool, `SELECT (SELECT count(*) FROM intake_plan_change WHERE intake_id = $1) * 10
		    + (SELECT count(*) FROM intake_plan_change_column WHERE intake_id = $1)`, fs[0].ID); n != 0 {
		t.Errorf("the plan changes of a file no longer waiting kept (%d)", n)
	}
	if n := testenv.Count(t, pool, `SELECT (SELECT count(*) FROM intake_plan_change WHERE intake_id = $1) * 10
		    + (SELECT count(*) FROM intake_plan_change_column WHERE intake_id = $1)`, waiting); n != 11 {
		t.Errorf("the plan changes of a waiting file purged (%d)", n)
	}
	if !strings.Contains(out, "purge: 1 spool files") || !strings.Contains(out, "1 row issues, 0 claim ids, 3 reports, 1 audit entries removed") {
		t.Fatalf("purge said:\n%s", out)
	}
	sp := filepath.Join(spoolDir, "purge", "sha256")
	var left int
	filepath.WalkDir(sp, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			left++
		}
		return nil
	})
	if left != 1 {
		t.Fatalf("%d spool files left, want the held conflict's", left)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1`, fs[0].ID); n != 0 {
		t.Fatal("row issues of the old file kept")
	}
	if got := site.Files(t, "reports"); len(got) != 1 {
		t.Fatalf("reports left: %v, want the held file's receipt", got)
	}
}

// A replay that applied nothing, a newer snapshot of its feed applied
// before it (the command's own check passed, then a daemon applied the
// newer one), says so, with the reason and how to apply it anyway, and
// exits 1: it printed "archived, rows 0 applied" and exited 0, as if the
// mapping fix were in the table.
func TestAReplaySupersededOnTheWayNeedsAttention(t *testing.T) {
	var stdout, stderr strings.Builder
	in := &ledger.Intake{ID: 57, State: ledger.StateArchived, Reason: reason.Superseded}
	if code := replayEnded(&stdout, &stderr, 29, in); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(stdout.String(), "archived (superseded)") || !strings.Contains(stderr.String(), "applied nothing") ||
		!strings.Contains(stderr.String(), "intake replay 29 --force-older") {
		t.Errorf("stdout %q, stderr %q: want the reason, that nothing applied and how to apply it anyway", stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	in = &ledger.Intake{ID: 58, State: ledger.StateArchived, RowsApplied: 3}
	if code := replayEnded(&stdout, &stderr, 29, in); code != 0 || stderr.Len() != 0 {
		t.Errorf("an applied replay: exit %d, stderr %q", code, stderr.String())
	}
}
