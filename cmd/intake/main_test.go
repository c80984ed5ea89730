package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/fault"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(asCLIEnv) == "1" {
		// The test binary run as intake by a shell's completion script
		// (cliOnPath).
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	testenv.Main(m, removeBinaries)
}

// cfgOpts are the knobs the CLI and crash tests turn.
type cfgOpts struct {
	worker, lease, poll, schedule, spool string
	affinity                             string
	chunkRows                            int
	knownHosts                           string
	feedExtra                            string // YAML lines appended to the feed, indented 8 spaces
}

// ordersColumnsYAML is the orders feed's column list (testenv.OrdersFeed,
// with precisions the target's columns take), indented for a feed.
const ordersColumnsYAML = `          - {name: order_id, type: text, required: true, max_length: 32}
          - {name: email, type: email}
          - {name: amount, type: decimal, scale: 2, precision: 12, required: true}
          - {name: status, type: enum, values: [new, paid, shipped], required: true}
          - {name: placed_at, type: timestamp, required: true}
          - {name: qty, type: integer, precision: 9}
`

func writeConfig(t *testing.T, site *testenv.Site, knownHosts string) string {
	return writeConfigOpts(t, site, cfgOpts{knownHosts: knownHosts})
}

func writeConfigOpts(t *testing.T, site *testenv.Site, o cfgOpts) string {
	t.Helper()
	c := site.Config
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&o.worker, "cli-1")
	def(&o.lease, "2m")
	def(&o.poll, "@every 10s")
	def(&o.schedule, "@every 1m")
	def(&o.knownHosts, c.SFTP.KnownHostsFile)
	def(&o.affinity, "partner")
	if o.spool == "" {
		o.spool = t.TempDir()
	}
	if o.chunkRows == 0 {
		o.chunkRows = 10000
	}
	cfg := fmt.Sprintf(`worker_id: %s
lease: %s
affinity: %s
drain: 5s
database:
  url_env: INTAKE_DATABASE_URL
spool:
  dir: %s
  min_free_bytes: 1
http:
  listen: 127.0.0.1:0
reconcile:
  schedule: "%s"
partners:
  - id: %s
    poll: "%s"
    sftp:
      address: %s
      user: %s
      private_key_file: %s
      known_hosts_file: %s
      root: %s
    feeds:
      - name: orders
        pattern: 'orders-.*\.csv'
        chunk_rows: %d
        columns:
%s        key: [order_id]
        target: orders
%s`, o.worker, o.lease, o.affinity, o.spool, o.schedule, c.ID, o.poll, c.SFTP.Address, c.SFTP.User, c.SFTP.PrivateKeyFile, o.knownHosts, c.SFTP.Root, o.chunkRows, ordersColumnsYAML, o.feedExtra)
	p := filepath.Join(t.TempDir(), "intake.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runCLI runs the command in this process, its stdout, stderr and log
// into one buffer. The buffer takes one write at a time, as a terminal
// does: the daemon's goroutines (a dial under way when the command
// returns, say) log beside the command's own output.
func runCLI(args ...string) (int, string) {
	var out syncBuffer
	code := run(args, &out, &out)
	return code, out.String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// intake keeps its tables in a schema of its own. A database whose
// intake tables are in another schema (made under a path with a "$user"
// schema first) is refused by `intake migrate`, naming the schema, rather
// than given a second, empty ledger.
func TestMigrateRefusesIntakeTablesInAnotherSchema(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	if _, err := pool.Exec(context.Background(), `CREATE SCHEMA intake_owner; ALTER TABLE intake.intake_schema_migrations SET SCHEMA intake_owner`); err != nil {
		t.Fatal(err)
	}
	code, out := runCLI("migrate")
	if w := "intake's tables are in schema intake_owner, and intake keeps them in intake"; code != 1 || !strings.Contains(out, w) {
		t.Fatalf("migrate exited %d, want 1 and %q:\n%s", code, w, out)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = 'intake' AND tablename = 'intake_schema_migrations'`); n != 0 {
		t.Fatal("migrate made a second migrations table")
	}
}

// A ledger an earlier release kept in public is moved into intake's own
// schema by `intake migrate`, with its rows, its grants (a role granted a
// right on its tables gets USAGE on the new schema) and the purge
// function's fixed search_path; the commands then find it there.
func TestMigrateMovesALedgerKeptInPublic(t *testing.T) {
	url, pool := testenv.DB(t)
	ctx := context.Background()
	t.Setenv("INTAKE_DATABASE_URL", url)
	// the layout of an earlier release: the schema at version 17 (what
	// later migrations made is dropped, by their down files), every ledger
	// table and function in public, intake's schema absent
	downs, err := filepath.Glob("../../migrations/*.down.sql")
	if err != nil {
		t.Fatal(err)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(downs)))
	for _, f := range downs {
		if filepath.Base(f) <= "017" {
			break
		}
		sql, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, string(sql))
	}
	mustExec(t, pool, `UPDATE intake_schema_migrations SET version = 17`)
	tables := testenv.Strings(t, pool, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'intake' ORDER BY 1`)
	var move []string
	for _, tb := range tables {
		move = append(move, `ALTER TABLE intake.`+tb+` SET SCHEMA public`)
	}
	move = append(move,
		`ALTER FUNCTION intake.intake_audit_guard() SET SCHEMA public`,
		`ALTER FUNCTION intake.intake_purge_audit(text, timestamptz) SET SCHEMA public`,
		`ALTER FUNCTION public.intake_purge_audit(text, timestamptz) SET search_path = public`,
		`DROP SCHEMA intake`,
		`CREATE ROLE legacy_reader`,
		`GRANT SELECT ON public.file_intake TO legacy_reader`,
		`INSERT INTO public.file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
			VALUES ('p1', 'orders', 'a.csv', 'processing/w/a.csv', 1, 'discarded', 'w', now())`)
	for _, q := range move {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP OWNED BY legacy_reader; DROP ROLE legacy_reader`) })

	if code, out := runCLI("migrate"); code != 0 || !strings.Contains(out, "schema at version") {
		t.Fatalf("migrate exited %d:\n%s", code, out)
	}
	if left := testenv.Strings(t, pool, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE '%intake%' ORDER BY 1`); len(left) != 0 {
		t.Fatalf("left in public: %v", left)
	}
	// each moved back, and the later migrations' tables made beside them
	got := testenv.Strings(t, pool, `SELECT tablename::text FROM pg_tables WHERE schemaname = 'intake' ORDER BY 1`)
	for _, tb := range tables {
		if !slices.Contains(got, tb) {
			t.Fatalf("tables in intake after the move: %v, want %v among them", got, tables)
		}
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake.file_intake WHERE partner_id = 'p1' AND remote_name = 'a.csv'`); n != 1 {
		t.Fatalf("the ledger's row did not move with its table: %d", n)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'intake' AND p.proname = 'intake_purge_audit' AND p.proconfig = '{search_path=intake}'`); n != 1 {
		t.Fatal("intake_purge_audit did not move with its search_path set to intake")
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = 'intake' AND has_schema_privilege('legacy_reader', oid, 'USAGE')`); n != 1 {
		t.Fatal("a role granted on the ledger's tables was not granted USAGE on intake's schema")
	}
	// a second run finds the ledger in place
	if code, out := runCLI("migrate"); code != 0 {
		t.Fatalf("migrate again exited %d:\n%s", code, out)
	}
}

func TestCheckMigrateAndRunOnce(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "cli")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)

	if code, out := runCLI("migrate", "--config", cfg); code != 0 || !strings.Contains(out, "schema at version") {
		t.Fatalf("migrate: %d %s", code, out)
	}
	code, out := runCLI("check", "--config", cfg)
	if code != 0 {
		t.Fatalf("check exited %d:\n%s", code, out)
	}
	for _, w := range []string{"ok   partner cli", "rename never overwrites", "ok   database", "target orders",
		"rows travel as COPY binary", "matched by index range",
		"partner cli access in ready/: list yes, read yes, create yes, rename yes, delete yes; fits readiness rename"} {
		if !strings.Contains(out, w) {
			t.Fatalf("check output lacks %q:\n%s", w, out)
		}
	}
	// a target column without a binary encoder is named, with the slower way
	if _, err := pool.Exec(context.Background(), `ALTER TABLE orders ALTER COLUMN amount TYPE double precision`); err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI("check", "--config", cfg); code != 0 || !strings.Contains(out, "COPY text (slower), for amount (decimal into double precision)") {
		t.Fatalf("check with a double precision column: %d\n%s", code, out)
	}
	if _, err := pool.Exec(context.Background(), `ALTER TABLE orders ALTER COLUMN amount TYPE numeric(12,2)`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-cli.csv", "order_id,email,amount,status,placed_at,qty\nQ-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n")
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once exited %d:\n%s", code, out)
	}
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT state FROM file_intake WHERE partner_id = 'cli'`).Scan(&state); err != nil || state != "archived" {
		t.Fatalf("got state %q (%v), want archived", state, err)
	}
}

func TestCheckNamesThePartnerWhoseHostKeyDiffers(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "wrongkey")
	other, _ := sshdtest.WriteKey(filepath.Join(t.TempDir(), "k"))
	kh := filepath.Join(t.TempDir(), "kh")
	os.WriteFile(kh, []byte(knownhosts.Line([]string{site.Config.SFTP.Address}, other)+"\n"), 0o600)
	code, out := runCLI("check", "--config", writeConfig(t, site, kh))
	if code != 1 || !strings.Contains(out, "FAIL partner wrongkey") || !strings.Contains(out, "does not match the pinned") {
		t.Fatalf("check exited %d:\n%s", code, out)
	}
}

func TestAConfigWithAnUnknownKeyIsRefused(t *testing.T) {
	site := testenv.NewSite(t, "typo")
	p := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	b, _ := os.ReadFile(p)
	os.WriteFile(p, bytes.Replace(b, []byte("    feeds:"), []byte("    feed:"), 1), 0o600)
	for _, cmd := range []string{"check", "run"} {
		code, out := runCLI(cmd, "--config", p)
		if code == 0 || !strings.Contains(out, "field feed not found") || !strings.Contains(out, "line "+strconv.Itoa(lineOf(string(b), "    feeds:"))) {
			t.Fatalf("%s exited %d:\n%s", cmd, code, out)
		}
	}
}

func lineOf(s, sub string) int { return 1 + strings.Count(s[:strings.Index(s, sub)], "\n") }

func TestUnknownCommandPrintsUsage(t *testing.T) {
	code, out := runCLI("frobnicate")
	if code != 2 || !strings.Contains(out, "Usage:") {
		t.Fatalf("got %d %s", code, out)
	}
}

func TestStatusSaysWhatNeedsAttention(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "stat")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	site.Drop(t, "orders-s1.csv", testenv.OrdersCSV("S", 4))
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d %s", code, out)
	}
	if code, out := runCLI("reconcile", "--config", cfg); code != 0 {
		t.Fatalf("reconcile: %d %s", code, out)
	}
	code, out := runCLI("status", "--config", cfg)
	if code != 0 || !strings.Contains(out, "archived 1") || !strings.Contains(out, "all well") || !strings.Contains(out, "reconciler (") ||
		!strings.Contains(out, "replicas: none running") {
		t.Fatalf("status of a healthy partner exited %d:\n%s", code, out)
	}
	// a conflicting resend is quarantined: status now needs a human
	site.Drop(t, "orders-s1.csv", testenv.OrdersCSV("T", 4))
	runCLI("run", "--config", cfg, "--once")
	runCLI("reconcile", "--config", cfg)
	code, out = runCLI("status", "--config", cfg, "--partner", "stat")
	held := testenv.Count(t, pool, `SELECT intake_id FROM file_intake WHERE state = 'quarantined'`)
	if code != 1 || !strings.Contains(out, "ATTN quarantine: 1 open") || !strings.Contains(out, fmt.Sprintf("quarantined intake=%d ", held)) {
		t.Fatalf("status with an open quarantine exited %d:\n%s", code, out)
	}
}

func TestStatusShowsProgressOfAFileBeingApplied(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "prog")
	cfg := writeConfigOpts(t, site, cfgOpts{chunkRows: 2})
	site.Drop(t, "orders-p.csv", testenv.OrdersCSV("P", 5))
	if err := fault.Set("apply:mid_chunk=error@2"); err != nil {
		t.Fatal(err)
	}
	defer fault.Set("")
	if code, out := runCLI("run", "--config", cfg, "--once"); code == 0 {
		t.Fatalf("run should fail at the injected fault:\n%s", out)
	}
	code, out := runCLI("status", "--config", cfg)
	if !strings.Contains(out, "applying intake 1 (worker cli-1): 2 of 5 rows") || !strings.Contains(out, "1 chunks") {
		t.Fatalf("status exited %d:\n%s", code, out)
	}
}

// `intake reconcile` beside another process's reconciler run (a daemon's
// scheduled one) waits for that run to end and then reports the failure
// matrix, instead of exiting 1 as if something needed a human.
func TestReconcileWaitsForARunInProgress(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "recw")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	if code, out := runCLI("migrate", "--config", cfg); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	ctx := context.Background()
	other, err := pool.Acquire(ctx) // another process's run holds the lock
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	var got bool
	if err := other.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('partner-intake/reconcile', 0))`).Scan(&got); err != nil || !got {
		t.Fatalf("take the reconciler's lock: %v %v", got, err)
	}
	var out syncBuffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"reconcile", "--config", cfg}, &out, &out) }()
	waitFor(t, time.Minute, func() bool { return strings.Contains(out.String(), "waiting for it to end") || len(done) > 0 })
	select {
	case code := <-done:
		t.Fatalf("reconcile ended (%d) while another run held the lock:\n%s", code, out.String())
	default:
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('partner-intake/reconcile', 0))`); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(out.String(), "finding(s)") {
			t.Fatalf("reconcile after the other run ended: %d\n%s", code, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("reconcile did not run once the lock was free:\n%s", out.String())
	}
}
