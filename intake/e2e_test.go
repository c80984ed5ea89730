package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// Every chunk on the merge path of a target that allows it is looked up
// for rows the target holds as they are (a production chunk only from
// unchangedMinRows rows), so the tests' small files judge their rows
// through it; the whole-chunk merge still runs for text targets, repeated
// keys and after a look that found most rows changed.
func TestMain(m *testing.M) {
	intake.SetUnchangedMinRows(1)
	testenv.Main(m)
}

const header = testenv.OrdersHeader

func goodRows(prefix string, n int) string { return testenv.OrdersCSV(prefix, n) }

// ordersFloat makes orders_float: the orders feed's table with a double
// precision amount, the tests' COPY text target.
func ordersFloat(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	exec(t, pool, `CREATE TABLE orders_float (
		partner_id text NOT NULL, order_id text NOT NULL, email text, amount double precision NOT NULL,
		status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL,
		PRIMARY KEY (partner_id, order_id))`)
}

type rig struct {
	t        *testing.T
	pool     *pgxpool.Pool
	reg      *prometheus.Registry
	d        *intake.Daemon
	spoolDir string
}

// reconcileOnce runs a reconciler of worker w1 on the rig's spool once
// (a released file is taken over by it, then polled).
func (r *rig) reconcileOnce(sites ...*testenv.Site) {
	r.t.Helper()
	r.reconcileAs("w1", sites...)
}

// reconcileAs runs a reconciler of worker on the rig's spool once.
func (r *rig) reconcileAs(worker string, sites ...*testenv.Site) {
	r.t.Helper()
	if err := r.reconcileRun(worker, sites...); err != nil {
		r.t.Fatal(err)
	}
}

// reconcileRun runs a reconciler of worker on the rig's spool once and
// returns its run's error.
func (r *rig) reconcileRun(worker string, sites ...*testenv.Site) error {
	r.t.Helper()
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		r.t.Fatal(err)
	}
	var cfgs []partners.Config
	for _, s := range sites {
		cfgs = append(cfgs, s.Validated(r.t))
	}
	rec, err := reconcile.New(reconcile.Config{}, worker, 30*time.Second, namedPool(r.t, r.pool, worker), sp, cfgs, prometheus.NewRegistry(), testenv.Logger(r.t), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rec.Stop()
	_, err = rec.RunOnce(context.Background())
	return err
}

func newRig(t *testing.T, pool *pgxpool.Pool, worker string, sites ...*testenv.Site) *rig {
	t.Helper()
	return newRigCfg(t, pool, intake.Config{WorkerID: worker, Lease: 30 * time.Second, SpoolMinFree: 1}, sites...)
}

func newRigCfg(t *testing.T, pool *pgxpool.Pool, cfg intake.Config, sites ...*testenv.Site) *rig {
	t.Helper()
	return newRigOn(t, pool, cfg, t.TempDir(), sites...)
}

// newRigOn is newRigCfg on the spool at spoolDir (a daemon restarted, or
// two sharing one).
func newRigOn(t *testing.T, pool *pgxpool.Pool, cfg intake.Config, spoolDir string, sites ...*testenv.Site) *rig {
	t.Helper()
	sp, err := spool.New(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []partners.Config
	for _, s := range sites {
		cfgs = append(cfgs, s.Validated(t))
	}
	reg := prometheus.NewRegistry()
	d, err := intake.New(cfg, cfgs, namedPool(t, pool, cfg.WorkerID), sp, reg, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return &rig{t: t, pool: pool, reg: reg, d: d, spoolDir: spoolDir}
}

// namedPool is a pool on pool's database whose connections are named as
// the daemon of worker names its own (ledger.AppName): the test
// database's transition guard (testenv) checks every state change they
// make against the ledger's transition table. The test's own statements
// on pool are not checked. A pool named so already is pool itself (a test
// that works on the daemon's connections made it).
func namedPool(t *testing.T, pool *pgxpool.Pool, worker string) *pgxpool.Pool {
	t.Helper()
	if pool.Config().ConnConfig.RuntimeParams["application_name"] == ledger.AppName(worker) {
		return pool
	}
	pc := pool.Config().Copy()
	pc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName(worker)
	named, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, named)
	return named
}

func (r *rig) poll(partner string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.PollOnce(ctx, partner); err != nil {
		r.t.Fatalf("poll %s: %v", partner, err)
	}
}

// pollPaused starts a poll with the fault step armed to pause and returns
// once the poll waits there; resume lets it go on and returns its error.
// The steps later are armed to pause too (fault.Paused, fault.Resume).
func (r *rig) pollPaused(partner, step string, later ...string) (resume func() error) {
	r.t.Helper()
	spec := step + "=pause"
	for _, s := range later {
		spec += "," + s + "=pause"
	}
	if err := fault.Set(spec); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { fault.Set("") })
	// run first: a test that fails while the poll waits does not hang in
	// its rig's Stop, which waits for the poll
	r.t.Cleanup(func() {
		for _, s := range append([]string{step}, later...) {
			fault.Resume(s)
		}
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- r.d.PollOnce(ctx, partner)
	}()
	select {
	case <-fault.Paused(step):
	case <-time.After(30 * time.Second):
		r.t.Fatalf("the poll never reached %s", step)
	}
	return func() error {
		fault.Resume(step)
		return <-done
	}
}

type fileRow = testenv.FileRow

func files(t *testing.T, pool *pgxpool.Pool, partner string) []fileRow {
	return testenv.Files(t, pool, partner)
}

func receipt(t *testing.T, s *testenv.Site, path string) sitefile.Receipt {
	t.Helper()
	rel, err := filepath.Rel(s.Root, path)
	if err != nil {
		t.Fatal(err)
	}
	var rc sitefile.Receipt
	if err := json.Unmarshal([]byte(s.Read(t, rel)), &rc); err != nil {
		t.Fatalf("receipt %s: %v", rel, err)
	}
	return rc
}

func count(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int64 {
	return testenv.Count(t, pool, q, args...)
}

func TestHappyPathLandsRowsAndArchivesTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-20261101.csv", goodRows("A", 5))
	r := newRig(t, pool, "w1", site)
	r.poll("acme")

	fs := files(t, pool, "acme")
	if len(fs) != 1 {
		t.Fatalf("got %d intake rows, want 1", len(fs))
	}
	f := fs[0]
	if f.State != "archived" || f.Batch != "orders-20261101" || f.Total != 5 || f.Applied != 5 || f.Rejected != 0 {
		t.Fatalf("got %+v, want archived with 5 applied", f)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND last_intake_id = $1`, f.ID); got != 5 {
		t.Fatalf("got %d target rows, want 5", got)
	}
	var amount, status string
	var qty int
	if err := pool.QueryRow(context.Background(), `SELECT amount::text, status, qty FROM orders WHERE partner_id='acme' AND order_id='A-3'`).Scan(&amount, &status, &qty); err != nil {
		t.Fatal(err)
	}
	if amount != "30.03" || status != "paid" || qty != 3 {
		t.Fatalf("got A-3 = %s %s %d, want 30.03 paid 3", amount, status, qty)
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ still holds %v", got)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	arch := site.Files(t, "archive")
	if len(arch) != 1 || !strings.HasPrefix(filepath.Base(arch[0]), "orders-20261101.") || !strings.HasSuffix(arch[0], fmt.Sprintf(".%d.csv", f.ID)) {
		t.Fatalf("archive holds %v, want one <batch>.<sha12>.<id>.csv", arch)
	}
	if got := site.Read(t, filepath.Join("archive", arch[0])); got != goodRows("A", 5) {
		t.Fatal("archived bytes differ from the bytes dropped")
	}
	rc := receipt(t, site, f.Receipt)
	if rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Applied != 5 || rc.Rows.Total != 5 || rc.IntakeID != f.ID || len(rc.SHA256) != 64 {
		t.Fatalf("receipt %+v", rc)
	}
	if f.Rejects != "" {
		t.Fatalf("a rejects report was written for a clean file: %s", f.Rejects)
	}
	if got := testutil.ToFloat64(r.d.Metrics().FilesFinished.WithLabelValues("acme", "archived")); got != 1 {
		t.Fatalf("files finished metric = %v, want 1", got)
	}
}

// The report's lines are the same whichever way they come: rendered from
// the plan's rejected rows held in memory, beside the apply, or read back
// from the ledger (a plan with more rejected rows than it holds).
func TestRejectedRowsAreReportedWithLineColumnAndReason(t *testing.T) {
	t.Run("held in memory", func(t *testing.T) { testRejectedRowsReported(t, 1) })
	t.Run("streamed from the spool", func(t *testing.T) {
		defer intake.SetMaxHeldIssues(2)()
		testRejectedRowsReported(t, 0)
	})
}

func testRejectedRowsReported(t *testing.T, fromPlan int64) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	content := header +
		"R-1,a@example.com,10.00,paid,2026-11-01T10:00:00Z,1\n" + // line 2 ok
		"R-2,not-an-email,10.00,paid,2026-11-01T10:00:00Z,1\n" + // line 3 bad email
		"R-3,b@example.com,10.001,paid,2026-11-01T10:00:00Z,1\n" + // line 4 scale
		"R-4,c@example.com,5,lost,2026-11-01T10:00:00Z,1\n" + // line 5 enum
		"=cmd|' /C calc'!A0,d@example.com,5,paid,2026-11-01T10:00:00Z,x\n" + // line 6 qty not integer
		"R-6,e@example.com,5,paid,2026-11-01T10:00:00Z\n" + // line 7 ragged
		"R-7,f@example.com,7.5,new,2026-11-01T10:00:00Z,\n" + // line 8 ok (qty optional)
		",g@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" + // line 9 key missing
		"R-9,h@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" + // line 10 ok
		"R-10,i@example.com,7.5,new,2026-11-01 10:00,2\n" + // line 11 bad timestamp
		"R-11,j@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" + // line 12 ok
		"R-12,k@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" + // line 13 ok
		"R-13,l@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" + // line 14 ok
		"R-14,m@example.com,7.5,new,2026-11-01T10:00:00Z,2\n" // line 15 ok
	site.Drop(t, "orders-rej.csv", content)
	r := newRig(t, pool, "w1", site)
	planned := intake.RejectsFromPlan()
	r.poll("acme")
	if got := intake.RejectsFromPlan() - planned; got != fromPlan {
		t.Fatalf("%d rejects reports rendered from the plan, want %d", got, fromPlan)
	}

	f := files(t, pool, "acme")[0]
	if f.State != "archived" || f.Total != 14 || f.Applied != 7 || f.Rejected != 7 {
		t.Fatalf("got %+v, want archived 14 rows: 7 applied, 7 rejected", f)
	}
	rc := receipt(t, site, f.Receipt)
	if rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Rejected != 7 || rc.Rejects == "" {
		t.Fatalf("receipt %+v", rc)
	}
	rel, _ := filepath.Rel(site.Root, f.Rejects)
	got := site.Read(t, rel)
	want := "line,column,reason,outcome,detail\n" +
		"3,email,bad_email,rejected,\n" +
		"4,amount,scale_exceeded,rejected,\n" +
		"5,status,not_in_enum,rejected,\n" +
		"6,qty,not_integer,rejected,\n" +
		"7,,field_count,rejected,\n" +
		"9,order_id,required_missing,rejected,\n" +
		"11,placed_at,bad_timestamp,rejected,\n"
	if got != want {
		t.Fatalf("rejects.csv:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, "calc") || strings.Contains(got, "not-an-email") {
		t.Fatal("rejects report echoes a cell value")
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 7 {
		t.Fatalf("got %d target rows, want 7", n)
	}
}

// A resend under the batch of a file already applied is read through its
// hash first (its batch is held: it is not scanned) and never touches the
// rows the first file wrote: the same bytes are a duplicate with no
// business effect, its receipt beside the original's; other bytes are
// quarantined as a batch conflict, kept in quarantine/ and in the spool
// for ops, and never applied.
func TestAResendOfAnAppliedBatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		resend   func(first string) string
		state    string // the resend's state and reason
		hashOnly string // what its hash-only read found
		then     func(t *testing.T, r *rig, site *testenv.Site, fs []fileRow, resent string)
	}{
		{"the same bytes", func(first string) string { return first }, "duplicate", "same",
			func(t *testing.T, r *rig, site *testenv.Site, fs []fileRow, _ string) {
				rc := receipt(t, site, fs[1].Receipt)
				if rc.Outcome != ledger.OutcomeDuplicate || rc.DuplicateOf != fs[0].ID {
					t.Fatalf("duplicate receipt %+v", rc)
				}
				if fs[0].Receipt == fs[1].Receipt {
					t.Fatal("the duplicate's receipt overwrote the original's")
				}
				if got := site.Files(t, "archive"); len(got) != 2 {
					t.Fatalf("archive holds %v, want both files (never overwritten)", got)
				}
			}},
		{"other bytes", func(first string) string { return strings.Replace(first, "30.03", "99.99", 1) }, "quarantined", "differ",
			func(t *testing.T, r *rig, site *testenv.Site, fs []fileRow, resent string) {
				if fs[1].Reason != "batch_conflict" {
					t.Fatalf("resend %+v, want the reason batch_conflict", fs[1])
				}
				if n := count(t, r.pool, `SELECT count(*) FROM orders WHERE partner_id='acme' AND amount = 99.99`); n != 0 {
					t.Fatal("the conflicting bytes were applied")
				}
				q := site.Files(t, "quarantine")
				sort.Strings(q)
				if len(q) != 2 || !strings.HasSuffix(q[1], ".reason.json") {
					t.Fatalf("quarantine holds %v, want the file and its reason", q)
				}
				if got := site.Read(t, filepath.Join("quarantine", q[0])); got != resent {
					t.Fatal("quarantined bytes differ from what was dropped")
				}
				// downloaded again once the hash differed: the spool holds
				// the conflicting bytes for ops
				var sha string
				if err := r.pool.QueryRow(context.Background(), `SELECT content_sha256 FROM file_intake WHERE intake_id = $1`, fs[1].ID).Scan(&sha); err != nil {
					t.Fatal(err)
				}
				if b, err := os.ReadFile(filepath.Join(r.spoolDir, "acme", "sha256", sha[:2], sha)); err != nil || string(b) != resent {
					t.Fatalf("the spool does not hold the conflicting bytes: %v", err)
				}
				var reason intake.QuarantineReason
				if err := json.Unmarshal([]byte(site.Read(t, filepath.Join("quarantine", q[1]))), &reason); err != nil {
					t.Fatal(err)
				}
				if reason.Reason != "batch_conflict" || reason.IntakeID != fs[1].ID || reason.PartnerID != "acme" {
					t.Fatalf("reason file %+v", reason)
				}
				rc := receipt(t, site, fs[1].Receipt)
				if rc.Outcome != ledger.OutcomeQuarantined || rc.Reason != "batch_conflict" {
					t.Fatalf("receipt %+v", rc)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer intake.SetScanCheckBytes(0)() // a resend is not scanned: its batch is held
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "acme")
			r := newRig(t, pool, "w1", site)
			first := goodRows("C", 3)
			site.Drop(t, "orders-c.csv", first)
			r.poll("acme")
			resent := tc.resend(first)
			site.Drop(t, "orders-c.csv", resent)
			r.poll("acme")

			fs := files(t, pool, "acme")
			if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != tc.state {
				t.Fatalf("got %+v, want archived then %s", fs, tc.state)
			}
			if tc.state == "duplicate" && fs[1].Reason != "duplicate" {
				t.Fatalf("resend %+v, want the reason duplicate", fs[1])
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id='acme' AND last_intake_id = $1`, fs[0].ID); n != 3 {
				t.Fatalf("got %d rows written by the original, want 3 (the resend must not touch them)", n)
			}
			if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1`, fs[1].ID); n != 0 {
				t.Fatalf("the resend applied %d chunks", n)
			}
			// its batch was held: read through the hash alone first
			if got := testutil.ToFloat64(r.d.Metrics().HashOnly.WithLabelValues("acme", tc.hashOnly)); got != 1 {
				t.Fatalf("hash-only reads that found the bytes %s: %v, want 1", tc.hashOnly, got)
			}
			tc.then(t, r, site, fs, resent)
		})
	}
}

// A batch conflict released with the new bytes winning takes the batch
// from the file it was held against, and binds it to what the released
// file applies (its data hash, as every binding). When another file bound
// the batch after the hold (the first gave it back, held in turn for
// another reason), the release is refused, naming that file: ops decided
// against the first file's bytes, not the later ones. Before, the release
// took the batch from whoever held it, and the released file's rows went
// over the later file's.
func TestAReleaseWithTheNewBytesWinningTakesTheBatchOnlyFromTheFileItMet(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(fmt.Sprintf("bound by a later file %v", later), func(t *testing.T) {
			ctx := context.Background()
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "acme")
			r := newRig(t, pool, "w1", site)
			first := goodRows("C", 3)
			site.Drop(t, "orders-c.csv", first)
			r.poll("acme")
			site.Drop(t, "orders-c.csv", strings.Replace(first, "30.03", "99.99", 1))
			r.poll("acme")
			fs := files(t, pool, "acme")
			if len(fs) != 2 || fs[1].Reason != "batch_conflict" {
				t.Fatalf("files %+v, want the second held batch_conflict", fs)
			}
			owner, held := fs[0].ID, fs[1].ID
			if n := count(t, pool, `SELECT count(*) FROM intake_quarantine WHERE intake_id = $1 AND batch_owner = $2`, held, owner); n != 1 {
				t.Fatalf("the hold does not record the binding it met (intake %d)", owner)
			}
			holder := owner
			if later {
				// the first file gives the batch back (as when it is held
				// again for another reason); a third version binds it
				execArgs(t, pool, `DELETE FROM intake_batch WHERE intake_id = $1`, owner)
				site.Drop(t, "orders-c.csv", strings.Replace(first, "30.03", "77.77", 1))
				r.poll("acme")
				fs = files(t, pool, "acme")
				if len(fs) != 3 || fs[2].State != "archived" {
					t.Fatalf("files %+v, want the third version archived", fs)
				}
				holder = fs[2].ID
			}
			err := ops.Release(ctx, pool, ops.Decision{IntakeID: held, Actor: "bob", Reason: "the resend is right",
				Winner: ops.WinnerNew, Partners: []string{"acme"}, Worker: intake.OpsWorker("ops")})
			bound := func() (id int64, sha string) {
				t.Helper()
				if err := pool.QueryRow(ctx, `SELECT intake_id, content_sha256 FROM intake_batch WHERE partner_id = 'acme'`).Scan(&id, &sha); err != nil {
					t.Fatal(err)
				}
				return id, sha
			}
			if later {
				if !errors.Is(err, ledger.ErrDecision) || !strings.Contains(err.Error(), fmt.Sprintf("now bound to intake %d", holder)) {
					t.Fatalf("release: %v, want it refused naming intake %d", err, holder)
				}
				if id, _ := bound(); id != holder {
					t.Fatalf("the batch is bound to intake %d, want %d still", id, holder)
				}
				if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND amount = 77.77`); n != 1 {
					t.Fatal("the later file's row is gone")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var data string
			if err := pool.QueryRow(ctx, `SELECT data_sha256 FROM file_intake WHERE intake_id = $1`, held).Scan(&data); err != nil {
				t.Fatal(err)
			}
			if id, sha := bound(); id != held || sha != data {
				t.Fatalf("the batch is bound to intake %d under %s, want %d under its data hash %s", id, sha, held, data)
			}
			r.reconcileOnce(site)
			r.poll("acme")
			if f := files(t, pool, "acme")[1]; f.State != "archived" {
				t.Fatalf("the released file %+v, want archived", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND amount = 99.99`); n != 1 {
				t.Fatal("the released file's bytes were not applied")
			}
		})
	}
}

func TestReplayOfSameBytesUnderNewBatchIsAllUnchanged(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-first.csv", goodRows("P", 4))
	r.poll("acme")
	site.Drop(t, "orders-again.csv", goodRows("P", 4))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Unchanged != 4 || fs[1].Applied != 0 {
		t.Fatalf("got %+v, want the replay archived with 4 unchanged", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id='acme' AND last_intake_id = $1`, fs[0].ID); n != 4 {
		t.Fatalf("replay rewrote rows: %d rows still carry the first intake, want 4", n)
	}
}

func TestNewerWriteIsNotOverwrittenByAnOlderIntake(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-n1.csv", goodRows("N", 2))
	r.poll("acme")
	// A newer intake (higher id) wrote N-1 with other values.
	if _, err := pool.Exec(context.Background(), `UPDATE orders SET amount = 1.00, last_intake_id = 1000000 WHERE order_id = 'N-1'`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-n2.csv", goodRows("N", 2))
	r.poll("acme")
	f := files(t, pool, "acme")[1]
	if f.State != "archived" || f.Confl != 1 || f.Unchanged != 1 {
		t.Fatalf("got %+v, want 1 conflict and 1 unchanged", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id = 'N-1' AND amount = 1.00`); n != 1 {
		t.Fatal("the newer write was overwritten")
	}
}

// Files of a feed applied out of their claim order. A newer file finds a
// row as it says while an older file of its feed still waits (for
// approval here; held or failed files may be released or replayed too):
// it claims the row. The older file, approved after it, meets that row as
// a newer write and leaves it; a row the newer file did not name takes the
// older file's value. Without the claim the older file's 99.00 won. On
// the guarded binary target, a COPY text one, in update_only mode, and
// with the newer file of another feed of the partner writing the table.
func TestAnOlderFileAppliedAfterANewerOneLeavesWhatTheNewerFoundAsItIs(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	ordersFloat(t, pool)
	for _, tc := range []struct {
		partner, target string
		mode            partners.Mode
		newer           string // the newer file's name: another feed of the table's when not orders-
	}{
		{"og", "orders", partners.ModeUpsert, "orders-3.csv"},
		{"ot", "orders_float", partners.ModeUpsert, "orders-3.csv"},
		{"ou", "orders", partners.ModeUpdateOnly, "orders-3.csv"},
		{"of", "orders", partners.ModeUpsert, "fix-3.csv"},
	} {
		site := testenv.NewSite(t, tc.partner)
		site.Config.Feeds[0].Target = tc.target
		fix := testenv.OrdersFeed()
		fix.Name, fix.Pattern, fix.Target = "fix", `fix-.*\.csv`, tc.target
		site.Config.Feeds = append(site.Config.Feeds, fix)
		r := newRig(t, pool, "w1-"+tc.partner, site)
		site.Drop(t, "orders-1.csv", goodRows("A", 4))
		r.poll(tc.partner)
		r.d.Stop()
		site.Config.Feeds[0].Mode = tc.mode
		site.Config.Feeds[0].Approval = &partners.Approval{MaxUpdateRatio: ratio(0.6)}
		r = newRig(t, pool, "w2-"+tc.partner, site)
		// the older file changes 3 of 4 rows, over the ratio: it waits
		site.Drop(t, "orders-2.csv", header+ordersLine("A", 1, "99.00")+ordersLine("A", 2, "98.00")+ordersLine("A", 3, "97.00")+ordersLine("A", 4, ""))
		r.poll(tc.partner)
		// the newer file says A-1 is what orders-1 said, and changes A-4
		site.Drop(t, tc.newer, header+ordersLine("A", 1, "")+ordersLine("A", 4, "44.00"))
		r.poll(tc.partner)
		fs := files(t, pool, tc.partner)
		older, newer := fs[1], fs[2]
		if older.State != "awaiting_approval" || newer.State != "archived" || newer.Applied != 1 || newer.Unchanged != 1 {
			t.Fatalf("%s: files %+v, want the older waiting and the newer archived with 1 applied, 1 unchanged", tc.partner, fs)
		}
		if a, last := amountOf(t, pool, tc.target, tc.partner, "A-1"); a != "10.01" || last != newer.ID {
			t.Fatalf("%s: A-1 = %s by intake %d, want 10.01 claimed by the newer intake %d", tc.partner, a, last, newer.ID)
		}
		if _, last := amountOf(t, pool, tc.target, tc.partner, "A-2"); last != fs[0].ID {
			t.Fatalf("%s: A-2, which the newer file did not name, was claimed by intake %d", tc.partner, last)
		}
		// approved, the older file is planned again before its first
		// chunk and waits once more when its plan changed
		for range 2 {
			v, _ := planOf(t, pool, tc.partner, older.ID)
			if err := approve(ctx, pool, tc.partner, older.ID, v.Hash); err != nil {
				t.Fatal(err)
			}
			r.poll(tc.partner)
			if older = files(t, pool, tc.partner)[1]; older.State != "awaiting_approval" {
				break
			}
		}
		if older.State != "archived" || older.Applied != 2 || older.Confl != 2 || older.Unchanged != 0 {
			t.Fatalf("%s: older file %+v, want archived: 2 applied, 2 conflicts (A-1, A-4)", tc.partner, older)
		}
		for key, want := range map[string]string{"A-1": "10.01", "A-2": "98", "A-3": "97", "A-4": "44"} {
			if a, _ := amountOf(t, pool, tc.target, tc.partner, key); strings.TrimSuffix(a, ".00") != want {
				t.Errorf("%s: %s = %s, want %s", tc.partner, key, a, want)
			}
		}
		r.d.Stop()
	}
}

func TestManifestModeAppliesOnlyAgreeingPairs(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mani")
	site.Config.Readiness = partners.ReadinessManifest
	r := newRig(t, pool, "w1", site)

	good := goodRows("M", 3)
	bad := goodRows("X", 3)
	site.Drop(t, "orders-m1.csv", good)
	r.poll("mani")
	if fs := files(t, pool, "mani"); len(fs) != 0 {
		t.Fatalf("a data file without its manifest was claimed: %+v", fs)
	}
	site.Drop(t, "orders-m1.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q, "rows": 3}`, len(good), sha(good)))
	site.Drop(t, "orders-m2.csv", bad)
	site.Drop(t, "orders-m2.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(bad), sha("something else")))
	r.poll("mani")

	byName := map[string]fileRow{}
	for _, f := range files(t, pool, "mani") {
		byName[f.Name] = f
	}
	if f := byName["orders-m1.csv"]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("agreeing pair: %+v, want archived with 3 applied", f)
	}
	if f := byName["orders-m2.csv"]; f.State != "quarantined" || f.Reason != "manifest_mismatch" {
		t.Fatalf("disagreeing pair: %+v, want quarantined manifest_mismatch", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id='mani' AND order_id LIKE 'X-%'`); n != 0 {
		t.Fatal("rows of the mismatching file were applied")
	}
	arch := site.Files(t, "archive")
	if len(arch) != 2 {
		t.Fatalf("archive holds %v, want data file and manifest", arch)
	}
	if len(site.Files(t, "ready")) != 0 {
		t.Fatalf("ready/ still holds %v", site.Files(t, "ready"))
	}
}

func TestTwoWorkersRacingApplyEachFileOnce(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "race")
	const nfiles = 24
	for i := 0; i < nfiles; i++ {
		site.Drop(t, fmt.Sprintf("orders-%02d.csv", i), goodRows(fmt.Sprintf("F%02d", i), 5))
	}
	r1 := newRig(t, pool, "w1", site)
	r2 := newRig(t, pool, "w2", site)
	var wg sync.WaitGroup
	for _, r := range []*rig{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := r.d.PollOnce(ctx, "race"); err != nil {
				t.Errorf("poll: %v", err)
			}
		}()
	}
	wg.Wait()
	fs := files(t, pool, "race")
	if len(fs) != nfiles {
		t.Fatalf("got %d intake rows, want %d (one per file)", len(fs), nfiles)
	}
	names := map[string]bool{}
	for _, f := range fs {
		if f.State != "archived" || f.Applied != 5 {
			t.Fatalf("file %+v, want archived with 5 applied", f)
		}
		if names[f.Name] {
			t.Fatalf("%s was processed twice", f.Name)
		}
		names[f.Name] = true
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id='race'`); n != nfiles*5 {
		t.Fatalf("got %d target rows, want %d", n, nfiles*5)
	}
	if n := count(t, pool, `SELECT count(DISTINCT worker_id) FROM file_intake WHERE partner_id='race'`); n < 1 {
		t.Fatal("no worker recorded")
	}
}

// Row 15 (size): a file over the partner's byte limit is quarantined
// without being parsed, and the partner's receipt says why.
func TestFileOverTheSizeLimitIsQuarantinedUnparsed(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "big")
	site.Config.Limits.MaxFileBytes = 1000
	site.Drop(t, "orders-big.csv", goodRows("G", 100))
	r := newRig(t, pool, "w1", site)
	r.poll("big")
	f := files(t, pool, "big")[0]
	if f.State != "quarantined" || f.Reason != "file_too_large" || f.Total != 0 {
		t.Fatalf("got %+v, want quarantined file_too_large, unparsed", f)
	}
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeQuarantined || rc.Reason != "file_too_large" {
		t.Fatalf("receipt %+v", rc)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatal("rows were applied")
	}
}

// A key repeated in one file: the later line wins, the earlier is rejected
// as duplicate_key (equal decimal keys written differently included).
func TestRepeatedKeyInAFileKeepsTheLastLine(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "dupkey")
	site.Drop(t, "orders-dk.csv", header+
		"D-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
		"D-2,a@b.io,2.00,new,2026-11-01T00:00:00Z,1\n"+
		"D-1,a@b.io,3.00,paid,2026-11-01T00:00:00Z,1\n")
	r := newRig(t, pool, "w1", site)
	r.poll("dupkey")
	f := files(t, pool, "dupkey")[0]
	if f.State != "archived" || f.Applied != 2 || f.Rejected != 1 || f.Total != 3 {
		t.Fatalf("got %+v, want 2 applied and 1 rejected", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id = 'D-1' AND amount = 3.00 AND status = 'paid'`); n != 1 {
		t.Fatal("the last line of a repeated key did not win")
	}
	rel, _ := filepath.Rel(site.Root, f.Rejects)
	if got := site.Read(t, rel); !strings.Contains(got, "2,,duplicate_key,rejected") {
		t.Fatalf("rejects.csv:\n%s", got)
	}
}

// ordersLine is line i of goodRows(prefix, n), with the amount replaced
// when amount is not empty.
func ordersLine(prefix string, i int, amount string) string {
	if amount == "" {
		amount = fmt.Sprintf("%d.%02d", i*10, i%100)
	}
	return fmt.Sprintf("%s-%d,c%d@example.com,%s,paid,2026-11-0%dT10:00:00Z,%d\n", prefix, i, i, amount, 1+i%9, i)
}

// Files whose keys exist (so the merge, not the straight COPY, applies
// them) get each row judged: updated, inserted, unchanged, or a conflict
// with a newer intake's row (which only the merge's probe can see: the
// ON CONFLICT guard alone would silently skip it), whether the chunk's
// keys are clustered or spread over the whole table.
func TestMergeJudgesEveryRowOfClusteredAndSpreadKeys(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-m0.csv", goodRows("M", 60))
	r.poll("acme")
	// a newer intake wrote M-12 and M-9 since: the files below conflict there
	if _, err := pool.Exec(context.Background(), `UPDATE orders SET amount = 9.99, last_intake_id = 1000000 WHERE order_id IN ('M-12', 'M-9')`); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		body string
	}{
		// keys M-10..M-12: next to each other in the index
		{"clustered", ordersLine("M", 10, "") + ordersLine("M", 11, "1.11") +
			"M-11a,new@example.com,5.00,new,2026-11-01T10:00:00Z,1\n" + ordersLine("M", 12, "")},
		// keys M-1..Z-1: spread over the whole table
		{"spread", ordersLine("M", 1, "2.22") + ordersLine("M", 60, "") + ordersLine("M", 9, "") +
			"Z-1,z@example.com,7.00,new,2026-11-01T10:00:00Z,1\n"},
	}
	for i, c := range cases {
		site.Drop(t, fmt.Sprintf("orders-m%d.csv", i+1), header+c.body)
		r.poll("acme")
		f := files(t, pool, "acme")[i+1]
		if f.State != "archived" || f.Applied != 2 || f.Unchanged != 1 || f.Confl != 1 {
			t.Fatalf("%s: got %+v, want 2 applied (one update, one insert), 1 unchanged, 1 conflict", c.name, f)
		}
	}
	first := files(t, pool, "acme")[0].ID
	for key, want := range map[string]string{"M-11": "1.11", "M-1": "2.22", "M-11a": "5.00", "Z-1": "7.00", "M-10": "100.10", "M-60": "600.60", "M-12": "9.99", "M-9": "9.99"} {
		var got string
		if err := pool.QueryRow(context.Background(), `SELECT amount::text FROM orders WHERE partner_id = 'acme' AND order_id = $1`, key).Scan(&got); err != nil || got != want {
			t.Errorf("%s: amount %q (%v), want %s", key, got, err, want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND last_intake_id = $1`, first); n != 56 {
		t.Fatalf("%d rows still carry the first intake, want 56 (unchanged rows are never rewritten)", n)
	}
}

// Remote directories are made sure of once per session; one removed by
// hand meanwhile fails that poll, and the next poll (a new session) makes
// it again and finishes the file.
func TestArchiveDirRemovedByHandIsMadeAgain(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-d1.csv", goodRows("D", 2))
	r.poll("acme")
	if err := os.RemoveAll(filepath.Join(site.Root, "archive")); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-d2.csv", goodRows("E", 2))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = r.d.PollOnce(ctx, "acme") // may fail: the session believed the directory was there
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" {
		t.Fatalf("got %+v, want the second file archived", fs)
	}
	if _, err := os.Stat(fs[1].Archive); err != nil {
		t.Fatalf("archive %s: %v", fs[1].Archive, err)
	}
}

// A target whose column types have no binary encoder here (double
// precision, citext-like domains, ...) is loaded through COPY text and the
// merge's casts: fresh rows, then a replay judged unchanged, then a change.
func TestTargetWithoutBinaryEncodersUsesCopyText(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	ordersFloat(t, pool)
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].Target = "orders_float"
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-f1.csv", goodRows("F", 3))
	r.poll("acme")
	site.Drop(t, "orders-f2.csv", goodRows("F", 3))
	r.poll("acme")
	site.Drop(t, "orders-f3.csv", header+ordersLine("F", 2, "7.25"))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[0].Applied != 3 || fs[1].Unchanged != 3 || fs[2].Applied != 1 {
		t.Fatalf("got %+v, want 3 applied, then 3 unchanged, then 1 applied", fs)
	}
	var amount float64
	if err := pool.QueryRow(ctx, `SELECT amount FROM orders_float WHERE order_id = 'F-2'`).Scan(&amount); err != nil || amount != 7.25 {
		t.Fatalf("F-2 amount %v (%v), want 7.25", amount, err)
	}
	// a group of small files takes the same COPY text into that target:
	// new keys in one COPY, then keys that exist through the merge
	site.Drop(t, "orders-g1.csv", goodRows("G", 2))
	site.Drop(t, "orders-g2.csv", goodRows("H", 2))
	r.poll("acme")
	site.Drop(t, "orders-g3.csv", goodRows("G", 3))
	site.Drop(t, "orders-g4.csv", header+ordersLine("H", 1, "8.50"))
	r.poll("acme")
	if got := testutil.ToFloat64(r.d.Metrics().Grouped.WithLabelValues("acme", "grouped")); got != 4 {
		t.Fatalf("%v files went through a group, want 4", got)
	}
	m := byName(files(t, pool, "acme"))
	if g1, g3, g4 := m["orders-g1.csv"], m["orders-g3.csv"], m["orders-g4.csv"]; g1.Applied != 2 || g3.Applied != 1 || g3.Unchanged != 2 || g4.Applied != 1 {
		t.Fatalf("got %+v, %+v, %+v: want 2 applied; 1 applied and 2 unchanged; 1 applied", g1, g3, g4)
	}
	if err := pool.QueryRow(ctx, `SELECT amount FROM orders_float WHERE order_id = 'H-1'`).Scan(&amount); err != nil || amount != 8.5 {
		t.Fatalf("H-1 amount %v (%v), want 8.5", amount, err)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders_float`); got != 3+3+2 {
		t.Fatalf("target holds %d rows, want 8", got)
	}
}

// Two workers claim from one partner and the first to rename a file
// stalls before recording it: the other worker's claim of a newer file
// waits for the first one's claim section to end, so the older file
// still gets the smaller intake id and the newer file's write of a key
// wins, which is what the partner sent last.
func TestClaimOrderDecidesIdsAcrossWorkers(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "order")
	site.Config.GroupFiles = 1 // one file per claim: the slow worker renames only the older one
	older := header + "K-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n"
	newer := header + "K-1,a@example.com,2.00,shipped,2026-11-02T10:00:00Z,1\n"
	site.Drop(t, "orders-1.csv", older)
	site.Drop(t, "orders-2.csv", newer)
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(site.Root, "ready", "orders-1.csv"), past, past); err != nil {
		t.Fatal(err)
	}
	slow, fast := newRig(t, pool, "slow", site), newRig(t, pool, "fast", site)
	resume := slow.pollPaused("order", "claim:after_rename") // renames orders-1.csv, then waits in its claim section
	fastDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		fastDone <- fast.d.PollOnce(ctx, "order") // lists orders-2.csv, then waits for the claim lock
	}()
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_database db ON db.oid = l.database WHERE db.datname = pg_catalog.current_database() AND l.locktype = 'advisory' AND NOT l.granted`) > 0
	}, func() string { return "the second worker's claim never waited on the first one's claim section" })
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-fastDone; err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "order")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "archived" {
		t.Fatalf("got %+v, want both files archived", fs)
	}
	ids := map[string]int64{}
	for _, f := range fs {
		ids[f.Name] = f.ID
	}
	if ids["orders-1.csv"] >= ids["orders-2.csv"] {
		t.Fatalf("the older file has intake id %d, the newer %d: claim order lost", ids["orders-1.csv"], ids["orders-2.csv"])
	}
	var amount string
	if err := pool.QueryRow(context.Background(), `SELECT amount::text FROM orders WHERE partner_id = 'order' AND order_id = 'K-1'`).Scan(&amount); err != nil {
		t.Fatal(err)
	}
	if amount != "2.00" {
		t.Fatalf("K-1 holds %s, want 2.00 from the newer file", amount)
	}
}

// A claim whose row was not recorded (the claim failed after its RENAME,
// or its process died there) is adopted under the id its claim allocated,
// whichever process adopts it: the claimer's next poll, the claimer
// restarted, a replica sweeping the stopped claimer's dir, or the
// reconciler. A newer file another replica claimed meanwhile keeps the
// higher id, and its value of the key wins over the older file applied
// after it.
func TestAClaimAdoptedByAnyProcessKeepsItsPlace(t *testing.T) {
	for _, tc := range []struct {
		name string
		// r2's lease: a third of it between r2's sweeps of the other
		// workers' dirs
		lease time.Duration
		adopt func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, r1, r2 *rig)
	}{
		{"its claimer's next poll", 30 * time.Second, func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, r1, r2 *rig) {
			r1.poll("place")
		}},
		{"its claimer restarted", 30 * time.Second, func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, r1, r2 *rig) {
			r1.d.Stop()
			newRig(t, pool, "r1", site).poll("place")
		}},
		{"a replica sweeping the dead claimer's dir", 3 * time.Second, func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, r1, r2 *rig) {
			died(t, pool, r1)
			waitFor(t, "r2 adopts the file in processing/r1", func() bool {
				r2.poll("place")
				return len(files(t, pool, "place")) == 2
			})
		}},
		{"the reconciler", 30 * time.Second, func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, r1, r2 *rig) {
			died(t, pool, r1)
			r2.reconcileAs("r2", site)
			r2.poll("place")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "place")
			site.Config.GroupFiles = 1
			site.Drop(t, "orders-1.csv", header+"K-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n")
			r1 := newRig(t, pool, "r1", site)
			r2 := newRigCfg(t, pool, intake.Config{WorkerID: "r2", Lease: tc.lease, SpoolMinFree: 1}, site)
			r1.claimFailsAfterRename("place")
			if got := site.Files(t, filepath.Join("processing", "r1")); len(got) != 1 || len(files(t, pool, "place")) != 0 {
				t.Fatalf("processing/r1 holds %v, want the claimed file without a row", got)
			}
			site.Drop(t, "orders-2.csv", header+"K-1,a@example.com,2.00,shipped,2026-11-02T10:00:00Z,1\n")
			r2.poll("place")
			tc.adopt(t, pool, site, r1, r2)
			ids := map[string]int64{}
			for _, f := range files(t, pool, "place") {
				if f.State != "archived" {
					t.Fatalf("%+v, want archived", f)
				}
				ids[f.Name] = f.ID
			}
			if len(ids) != 2 || ids["orders-1.csv"] >= ids["orders-2.csv"] {
				t.Fatalf("intake ids %v: the adopted older file must keep the id its claim allocated, below the newer file's", ids)
			}
			if a, _ := amountOf(t, pool, "orders", "place", "K-1"); a != "2.00" {
				t.Fatalf("K-1 holds %s, want 2.00 from the newer file", a)
			}
			if n := count(t, pool, `SELECT count(*) FROM intake_claim_id`); n != 0 {
				t.Fatalf("%d claim ids still kept once both files have rows", n)
			}
		})
	}
}

// A path keeps one claim id: one left there by a claim whose file never
// reached the path (here: put back into ready/ by hand, as if that claim
// had died before its RENAME) is replaced by the next claim whose RENAME
// to the path goes through, so the file's adoption takes that claim's id,
// not the older one.
func TestAClaimReplacesTheIDAClaimThatNeverRenamedLeftAtItsPath(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "stale")
	site.Config.GroupFiles = 1
	site.Drop(t, "orders-1.csv", header+"K-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n")
	r1 := newRig(t, pool, "r1", site)
	kept := func() (id int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT intake_id FROM intake_claim_id WHERE partner_id = 'stale'`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	r1.claimFailsAfterRename("stale")
	stale := kept()
	if err := os.Rename(filepath.Join(site.Root, "processing", "r1", "orders-1.csv"), filepath.Join(site.Root, "ready", "orders-1.csv")); err != nil {
		t.Fatal(err)
	}
	r1.claimFailsAfterRename("stale")
	var last int64
	if err := pool.QueryRow(ctx, `SELECT last_value FROM intake.file_intake_intake_id_seq`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if id := kept(); id != last || id <= stale {
		t.Fatalf("the path keeps id %d; the claim that renamed the file there allocated %d (the earlier claim %d)", id, last, stale)
	}
	r1.poll("stale")
	if f := files(t, pool, "stale"); len(f) != 1 || f[0].ID != last || f[0].State != "archived" {
		t.Fatalf("%+v, want the file archived under id %d", f, last)
	}
}

// A claim to a path another file takes (one waiting in processing/ for
// its adoption, here) finds it busy and keeps no id there: the waiting
// file's id, when the path kept one, stays its own, and the claim's own is
// dropped, so the waiting file is adopted under its id or a fresh one,
// never under the claim's.
func TestAClaimToABusyPathLeavesTheWaitingFilesID(t *testing.T) {
	for _, kept := range []bool{true, false} {
		t.Run(fmt.Sprintf("its_id_kept=%v", kept), func(t *testing.T) {
			_, pool := testenv.DB(t)
			ctx := context.Background()
			site := testenv.NewSite(t, "busy")
			site.Config.GroupFiles = 1
			site.Drop(t, "orders-0.csv", header+"K-0,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n")
			r1 := newRig(t, pool, "r1", site)
			r1.poll("busy") // settled: its polls no longer look through processing/r1/
			var path string
			if err := pool.QueryRow(ctx, `SELECT pg_catalog.replace(claimed_path, 'orders-0.csv', 'orders-1.csv') FROM file_intake
				WHERE partner_id = 'busy' AND state = 'archived'`).Scan(&path); err != nil {
				t.Fatal(err)
			}
			// a file claimed there whose row was not recorded
			if err := os.WriteFile(filepath.Join(site.Root, "processing", "r1", "orders-1.csv"), []byte(header+"K-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			var want []int64
			if kept {
				var waiting int64
				if err := pool.QueryRow(ctx, `INSERT INTO intake_claim_id (partner_id, claimed_path, intake_id)
					VALUES ('busy', $1, pg_catalog.nextval('intake.file_intake_intake_id_seq')) RETURNING intake_id`, path).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				want = []int64{waiting}
			}
			site.Drop(t, "orders-1.csv", header+"K-1,a@example.com,2.00,shipped,2026-11-02T10:00:00Z,1\n")
			r1.poll("busy")
			if got := testutil.ToFloat64(r1.d.Metrics().Skipped.WithLabelValues("busy", "claim_target_busy")); got != 1 {
				t.Fatalf("claims skipped for a busy path: %v, want 1", got)
			}
			rs, err := pool.Query(ctx, `SELECT intake_id FROM intake_claim_id WHERE partner_id = 'busy'`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rs, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("claim ids kept %v, want %v: the waiting file's alone", got, want)
			}
		})
	}
}

// A reconciler's adoption that records no row (a live row owns the path
// it moved the file to) leaves the id the file's claim kept, carried to
// that path: the file is adopted under it once the path is free, not
// under a fresh one.
func TestAnAdoptionThatRecordsNoRowKeepsTheFilesID(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "own")
	site.Config.GroupFiles = 1
	site.Drop(t, "orders-1.csv", header+"K-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n")
	r1 := newRig(t, pool, "r1", site)
	r1.claimFailsAfterRename("own")
	var from string
	var id int64
	if err := pool.QueryRow(ctx, `SELECT claimed_path, intake_id FROM intake_claim_id WHERE partner_id = 'own'`).Scan(&from, &id); err != nil {
		t.Fatal(err)
	}
	died(t, pool, r1)
	// the reconciler's own dir holds a live row's path of the same name
	// (its file waits in the spool)
	to := strings.Replace(from, "/processing/r1/", "/processing/rec/", 1)
	if _, err := pool.Exec(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('own', 'orders', 'orders-1.csv', $1, 10, 'spooled', 'rec', now() + interval '1 hour')`, to); err != nil {
		t.Fatal(err)
	}
	if err := r1.reconcileRun("rec", site); err == nil {
		t.Fatal("the reconciler's adoption recorded a row for a path a live row owns")
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_claim_id WHERE partner_id = 'own' AND claimed_path = $1 AND intake_id = $2`, to, id); n != 1 {
		t.Fatalf("the moved file's path keeps %d rows of its claim's id %d, want 1", n, id)
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE intake_id = $1`, id); n != 0 {
		t.Fatalf("a row holds the id %d of a file no row was recorded for", id)
	}
}

// claimFailsAfterRename polls partner with its claim failing right after
// its RENAME (as if the replies were lost): the file sits in the rig's
// processing dir without a row.
func (r *rig) claimFailsAfterRename(partner string) {
	r.t.Helper()
	if err := fault.Set("claim:after_rename=error"); err != nil {
		r.t.Fatal(err)
	}
	err := r.d.PollOnce(context.Background(), partner)
	fault.Set("")
	if err == nil {
		r.t.Fatal("the poll went past its claim's RENAME")
	}
}

// died stops r1 and makes its worker id's row that of a replica that
// crashed past its lease: its processing dir is a gone worker's.
func died(t *testing.T, pool *pgxpool.Pool, r1 *rig) {
	t.Helper()
	r1.d.Stop()
	if _, err := pool.Exec(context.Background(), `INSERT INTO intake_worker (worker_id, hostname, pid, lease, last_seen)
		VALUES ('r1', 'gone', 1, interval '30 seconds', now() - interval '1 hour')
		ON CONFLICT (worker_id) DO UPDATE SET last_seen = now() - interval '1 hour', drained_at = NULL`); err != nil {
		t.Fatal(err)
	}
}

// Another intake binds the same batch and commits while this one's bind is
// waiting on it: the bind must report that binding (a duplicate here), not
// a fence. The statement's snapshot predates the other commit, so it is
// asked again with a fresh one.
func TestBindWaitingOnAConcurrentBinderSeesItsBinding(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "bindrace")
	r := newRig(t, pool, "w1", site)
	ctx := context.Background()
	sha := strings.Repeat("ab", 32)
	var first, second int64
	for _, id := range []*int64{&first, &second} {
		if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
			state, worker_id, lease_until, batch_id, content_sha256, data_sha256)
			VALUES ('bindrace', 'orders', 'orders-b.csv', 'processing/w1/orders-b.csv.' || clock_timestamp(), 10,
			'spooled', 'w1', now() + interval '1 minute', 'B1', $1, $1) RETURNING intake_id`, sha).Scan(id); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO intake_batch (partner_id, batch_id, content_sha256, intake_id) VALUES ('bindrace', 'B1', $1, $2)`, sha, first); err != nil {
		t.Fatal(err)
	}
	type result struct {
		v     ledger.Verdict
		owner int64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		v, owner, err := intake.BindBatch(ctx, r.d, &ledger.Intake{ID: second, Token: 1, Partner: "bindrace", BatchID: "B1", SHA256: sha, DataSHA256: sha})
		done <- result{v, owner, err}
	}()
	// the bind waits on the uncommitted binding's index entry
	waitUntil(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO intake_batch%'`) == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || got.v != ledger.VerdictDuplicate || got.owner != first {
		t.Fatalf("bind: verdict %v owner %d err %v; want a duplicate of intake %d", got.v, got.owner, got.err, first)
	}
}
