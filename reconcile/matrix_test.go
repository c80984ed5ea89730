package reconcile_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type node struct {
	d   *intake.Daemon
	rec *reconcile.Reconciler
	sp  *spool.Spool
	reg *prometheus.Registry // the reconciler's
}

// newNode is one replica: a daemon and its reconciler, sharing a spool dir.
func newNode(t *testing.T, pool *pgxpool.Pool, worker, spoolDir string, sites ...*testenv.Site) *node {
	t.Helper()
	sp, err := spool.New(spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	var cfgs []partners.Config
	for _, s := range sites {
		cfgs = append(cfgs, s.Validated(t))
	}
	log := testenv.Logger(t)
	d, err := intake.New(intake.Config{WorkerID: worker, Lease: 10 * time.Second, SpoolMinFree: 1}, cfgs, pool, sp, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := reconcile.New(reconcile.Config{}, worker, 10*time.Second, pool, sp, cfgs, reg, log, d.TakenOver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Stop(); d.Stop() })
	return &node{d: d, rec: rec, sp: sp, reg: reg}
}

func (n *node) poll(t *testing.T, partner string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.d.PollOnce(ctx, partner)
}

func (n *node) reconcile(t *testing.T) []ledger.Finding {
	t.Helper()
	fs, err := n.rec.RunOnce(context.Background())
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return fs
}

func withFault(t *testing.T, spec string) {
	t.Helper()
	if err := fault.Set(spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
}

// stoppedAt polls partner on n with an error injected once at step: the
// poll must end on it.
func stoppedAt(t *testing.T, n *node, partner, step string) {
	t.Helper()
	withFault(t, step+"=error")
	if err := n.poll(t, partner); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("poll of %s: %v, want the stop injected at %s", partner, err, step)
	}
}

func kinds(fs []ledger.Finding) map[string]int {
	m := map[string]int{}
	for _, f := range fs {
		m[f.Kind]++
	}
	return m
}

func expireLeases(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET lease_until = now() - interval '1 second'
		WHERE state IN ('claimed','spooled','applying','applied','outcome_unknown')`); err != nil {
		t.Fatal(err)
	}
}

func bigSite(t *testing.T, id string, chunkRows int) *testenv.Site {
	s := testenv.NewSite(t, id)
	s.Config.Feeds[0].ChunkRows = chunkRows
	return s
}

// Row 9: a commit whose reply is lost, or that is lost before the server:
// outcome_unknown, resolved from the ledger, never a blind retry.
func TestCommitWithUnknownOutcomeIsResolvedFromTheLedger(t *testing.T) {
	for _, tt := range []struct{ name, fault string }{
		{"the commit landed but its reply was lost", "commit:reply_lost=error@2"},
		{"the commit never reached the server", "commit:lost=error@2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := bigSite(t, "unk", 100)
			site.Drop(t, "orders-u.csv", testenv.OrdersCSV("U", 450))
			n := newNode(t, pool, "w1", t.TempDir(), site)
			withFault(t, tt.fault)
			if err := n.poll(t, "unk"); err != nil {
				t.Fatal(err)
			}
			f := testenv.Files(t, pool, "unk")[0]
			if f.State != "outcome_unknown" {
				t.Fatalf("got %s, want outcome_unknown", f.State)
			}
			fs := n.reconcile(t)
			if kinds(fs)[ledger.KindOutcomeUnknown] != 1 || reconcile.NeedHuman(fs) {
				t.Fatalf("findings %+v", fs)
			}
			if err := n.poll(t, "unk"); err != nil {
				t.Fatal(err)
			}
			f = testenv.Files(t, pool, "unk")[0]
			if f.State != "archived" || f.Applied != 450 || f.Chunks != 5 {
				t.Fatalf("got %+v, want archived, 450 applied once, 5 chunks", f)
			}
			if got := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1`, f.ID); got != 5 {
				t.Fatalf("ledger holds %d chunks, want 5", got)
			}
			testenv.AssertExactOrders(t, pool, "unk", 450, "U")
		})
	}
}

// The last chunk's commit landed and its reply was lost: that commit also
// moved the file to applied, so the ledger already tells the outcome. The
// run reads it there (its own row, under its token, applied) and goes on
// to archive the file in the same poll: nothing is marked
// outcome_unknown, nothing waits for the reconciler, and the file's
// counts are the ledger's.
func TestTheLastChunksLostReplyIsReadFromTheLedger(t *testing.T) {
	_, pool := testenv.DB(t)
	site := bigSite(t, "unkl", 100)
	site.Drop(t, "orders-u.csv", testenv.OrdersCSV("U", 450))
	n := newNode(t, pool, "w1", t.TempDir(), site)
	withFault(t, "commit:reply_lost=error@5")
	if err := n.poll(t, "unkl"); err != nil {
		t.Fatal(err)
	}
	f := testenv.Files(t, pool, "unkl")[0]
	if f.State != "archived" || f.Applied != 450 || f.Chunks != 5 || f.Receipt == "" {
		t.Fatalf("got %+v, want archived in the same poll, 450 applied once in 5 chunks", f)
	}
	if n := testenv.Count(t, pool, `SELECT attempts FROM file_intake WHERE intake_id = $1`, f.ID); n != 0 {
		t.Fatalf("%d attempts spent, want none: the commit landed", n)
	}
	if fault.Hits("commit:reply_lost") != 5 {
		t.Fatalf("%d commits, want 5", fault.Hits("commit:reply_lost"))
	}
	if fs := n.reconcile(t); len(fs) != 0 {
		t.Fatalf("findings %+v, want none", fs)
	}
	testenv.AssertExactOrders(t, pool, "unkl", 450, "U")
}

// Rows 5 and 10: the owner committed and then stopped before archiving
// (its lease ran out). Another replica takes over with a new token, moves
// the file into its own processing dir and finishes the archive without
// applying anything again; the old owner's late writes are fenced.
func TestExpiredLeaseIsTakenOverWithoutReapplying(t *testing.T) {
	_, pool := testenv.DB(t)
	site := bigSite(t, "lease", 100)
	site.Drop(t, "orders-l.csv", testenv.OrdersCSV("L", 250))
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	w2 := newNode(t, pool, "w2", spoolDir, site)
	stoppedAt(t, w1, "lease", "apply:after_commit")
	if f := testenv.Files(t, pool, "lease")[0]; f.State != "applied" || f.Worker != "w1" {
		t.Fatalf("got %+v, want applied by w1", f)
	}
	if fs := w2.reconcile(t); kinds(fs)[ledger.KindLeaseExpired] != 0 {
		t.Fatalf("a live lease was taken over: %+v", fs)
	}
	expireLeases(t, pool)
	fs := w2.reconcile(t)
	if kinds(fs)[ledger.KindLeaseExpired] != 1 {
		t.Fatalf("findings %+v, want one lease_expired", fs)
	}
	if got := site.Files(t, "processing/w2"); len(got) != 1 {
		t.Fatalf("processing/w2 holds %v, want the taken-over file", got)
	}
	if err := w2.poll(t, "lease"); err != nil {
		t.Fatal(err)
	}
	f := testenv.Files(t, pool, "lease")[0]
	if f.State != "archived" || f.Worker != "w2" || f.Applied != 250 || f.Chunks != 3 {
		t.Fatalf("got %+v, want archived by w2 with the 250 rows applied once", f)
	}
	testenv.AssertExactOrders(t, pool, "lease", 250, "L")
	if got := site.Files(t, "archive"); len(got) != 1 {
		t.Fatalf("archive holds %v", got)
	}
	// The old owner comes back: its resume finds nothing of its own.
	if err := w1.poll(t, "lease"); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk`); got != 3 {
		t.Fatalf("ledger holds %d chunks, want 3", got)
	}
}

// A row of this worker whose lease expired is not taken over by this
// worker's own reconciler: its own daemon is told to resume it
// (TakenOver), as a file taken over from another worker is, once the row
// is due (not while it waits out a retry's backoff). A replica
// that another polls the partner for leaves the partner alone otherwise,
// and the file waited for as long as this replica led the reconcile runs.
func TestAnOwnExpiredRowIsHandedToItsOwnDaemon(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "own")
	site.Drop(t, "orders-o.csv", testenv.OrdersCSV("O", 5))
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	stoppedAt(t, w1, "own", "apply:after_commit")
	before := testenv.Files(t, pool, "own")[0]
	expireLeases(t, pool)
	var told []string
	rec, err := reconcile.New(reconcile.Config{}, "w1", 10*time.Second, pool, w1.sp, []partners.Config{site.Validated(t)},
		prometheus.NewRegistry(), testenv.Logger(t), func(partner string) { told = append(told, partner) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Stop)
	// waiting out a retry's backoff: nothing to tell yet
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET next_attempt_at = pg_catalog.now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(told) != 0 {
		t.Fatalf("the daemon was told of %q while its row waits out its backoff", told)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET next_attempt_at = NULL`); err != nil {
		t.Fatal(err)
	}
	fs, err := rec.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n := kinds(fs)[ledger.KindLeaseExpired]; n != 0 {
		t.Fatalf("findings %+v: its own row taken over", fs)
	}
	if !slices.Equal(told, []string{"own"}) {
		t.Fatalf("the daemon was told of %q, want of the partner whose row is its own", told)
	}
	if f := testenv.Files(t, pool, "own")[0]; f.Worker != "w1" || f.State != before.State {
		t.Fatalf("got %+v, want w1's row as it was (%s)", f, before.State)
	}
	if err := w1.poll(t, "own"); err != nil {
		t.Fatal(err)
	}
	if f := testenv.Files(t, pool, "own")[0]; f.State != "archived" || f.Applied != 5 {
		t.Fatalf("got %+v, want archived with its 5 rows applied once", f)
	}
	testenv.AssertExactOrders(t, pool, "own", 5, "O")
}

// Row 1 (and 2): the claim rename happened but the row was never written
// (crash, or the rename's reply was lost). The worker's own next poll adopts
// it; a dead worker's orphan is adopted by the reconciler of another.
func TestOrphanedClaimIsAdopted(t *testing.T) {
	t.Run("by the same worker on its next poll", func(t *testing.T) {
		pool, _, w1 := claimWithoutRow(t)
		if err := w1.poll(t, "orph"); err != nil {
			t.Fatal(err)
		}
		if fs := testenv.Files(t, pool, "orph"); len(fs) != 1 || fs[0].State != "archived" {
			t.Fatalf("got %+v", fs)
		}
		testenv.AssertExactOrders(t, pool, "orph", 5, "O")
	})
	t.Run("by another worker's reconciler when the claimer is gone", func(t *testing.T) {
		_, pool := testenv.DB(t)
		site := testenv.NewSite(t, "orph")
		site.Drop(t, "orders-o.csv", testenv.OrdersCSV("O", 5))
		spoolDir := t.TempDir()
		w1 := newNode(t, pool, "w1", spoolDir, site)
		w2 := newNode(t, pool, "w2", spoolDir, site)
		withFault(t, "claim:after_rename=error")
		w1.poll(t, "orph")
		fs := w2.reconcile(t)
		if kinds(fs)[ledger.KindOrphanClaim] != 1 {
			t.Fatalf("findings %+v", fs)
		}
		if err := w2.poll(t, "orph"); err != nil {
			t.Fatal(err)
		}
		if fs := testenv.Files(t, pool, "orph"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w2" {
			t.Fatalf("got %+v", fs)
		}
		testenv.AssertExactOrders(t, pool, "orph", 5, "O")
	})
}

// Rows 5 and 10 in one process: this worker's reconciler takes a file
// over and is held up before its move of the file ends (a RENAME that
// copies); the same process's poll, which resumes the worker's due rows,
// does not run the file where it is not yet: the takeover is the
// worker's only once its claim section commits, after the move, and the
// poll either waits for the section or does not see the row as the
// worker's. The next poll (the takeover's hint) runs it: the file is
// archived once, from the path it was moved to.
func TestAPollWaitsForItsOwnReconcilersTakeoverToMoveTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "tkmv")
	site.Drop(t, "orders-t.csv", testenv.OrdersCSV("T", 5))
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	w2 := newNode(t, pool, "w2", t.TempDir(), site) // a spool of its own
	stoppedAt(t, w1, "tkmv", "apply:after_commit")
	expireLeases(t, pool)
	withFault(t, "takeover:before_move=pause")
	recDone := make(chan []ledger.Finding, 1)
	go func() {
		fs, _ := w2.rec.RunOnce(context.Background())
		recDone <- fs
	}()
	select {
	case <-fault.Paused("takeover:before_move"):
	case <-time.After(30 * time.Second):
		t.Fatal("the reconciler never took the file over")
	}
	pollDone := make(chan error, 1)
	go func() { pollDone <- w2.poll(t, "tkmv") }()
	// the poll either ends (it ran the file before the move) or waits for
	// the claim section's lock
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return len(pollDone) > 0 || testenv.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`) > 0
	}, func() string { return "the poll neither ended nor waited" })
	fault.Resume("takeover:before_move")
	<-recDone
	if err := <-pollDone; err != nil {
		t.Fatalf("poll: %v", err)
	}
	if err := w2.poll(t, "tkmv"); err != nil {
		t.Fatalf("the poll after the takeover: %v", err)
	}
	fs := testenv.Files(t, pool, "tkmv")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w2" || fs[0].Archive == "" {
		t.Fatalf("rows %+v, want one file archived by w2 from where its takeover moved it", fs)
	}
	testenv.AssertExactOrders(t, pool, "tkmv", 5, "T")
	if got := append(site.Files(t, "processing/w1"), site.Files(t, "processing/w2")...); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}

// Row 1 with manifest readiness: the claim's RENAME of the data file went
// through and its manifest's did not (the crash between the two), so the
// manifest is still in ready/. Whoever adopts the file takes the manifest
// from there and checks the file against it: a manifest that disagrees
// holds the file, none of its rows applied.
func TestAnAdoptedClaimIsCheckedAgainstTheManifestLeftInReady(t *testing.T) {
	for _, by := range []string{"the same worker", "another worker's reconciler"} {
		t.Run(by, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "orphm")
			site.Config.Readiness = partners.ReadinessManifest
			body := testenv.OrdersCSV("M", 5)
			site.Drop(t, "orders-m.csv", body)
			site.Drop(t, "orders-m.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(body), strings.Repeat("ab", 32)))
			spoolDir := t.TempDir()
			w1 := newNode(t, pool, "w1", spoolDir, site)
			stoppedAt(t, w1, "orphm", "claim:after_rename")
			fault.Set("")
			if got := site.Files(t, "ready"); len(got) != 1 || !strings.HasSuffix(got[0], ".complete") {
				t.Fatalf("ready/ holds %v, want the manifest left behind", got)
			}
			adopter := w1
			if by != "the same worker" {
				adopter = newNode(t, pool, "w2", spoolDir, site)
				if fs := adopter.reconcile(t); kinds(fs)[ledger.KindOrphanClaim] != 1 {
					t.Fatalf("findings %+v", fs)
				}
			}
			if err := adopter.poll(t, "orphm"); err != nil {
				t.Fatal(err)
			}
			if fs := testenv.Files(t, pool, "orphm"); len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != "manifest_mismatch" {
				t.Fatalf("got %+v, want the file held against its manifest", fs)
			}
			if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'orphm'`); n != 0 {
				t.Fatalf("%d rows of a file its manifest disagrees with were applied", n)
			}
			if got := site.Files(t, "ready"); len(got) != 0 {
				t.Fatalf("ready/ still holds %v", got)
			}
		})
	}
}

// Row 12: the claimed file vanished from processing/. After commit, the
// file is finished from the spool and the loss is reported; before its
// bytes were safe, the file fails terminally as remote_lost.
func TestClaimedFileThatVanishes(t *testing.T) {
	t.Run("after commit: finished, loss reported", func(t *testing.T) {
		_, pool := testenv.DB(t)
		site := testenv.NewSite(t, "lost")
		site.Drop(t, "orders-v.csv", testenv.OrdersCSV("V", 5))
		w1 := newNode(t, pool, "w1", t.TempDir(), site)
		withFault(t, "apply:after_commit=error")
		w1.poll(t, "lost")
		if err := os.Remove(filepath.Join(site.Root, "processing", "w1", "orders-v.csv")); err != nil {
			t.Fatal(err)
		}
		if err := w1.poll(t, "lost"); err != nil {
			t.Fatal(err)
		}
		f := testenv.Files(t, pool, "lost")[0]
		if f.State != "archived" || f.Archive != "" || f.Applied != 5 {
			t.Fatalf("got %+v, want archived without an archive path", f)
		}
		rel, _ := filepath.Rel(site.Root, f.Receipt)
		if !strings.Contains(site.Read(t, rel), "disappeared from processing") {
			t.Fatal("the receipt does not say the file was lost")
		}
	})
	t.Run("after commit, with its manifest: the manifest goes to the archive", func(t *testing.T) {
		_, pool := testenv.DB(t)
		site := testenv.NewSite(t, "lost")
		site.Config.Readiness = partners.ReadinessManifest
		pair := func(prefix string) {
			body := testenv.OrdersCSV(prefix, 5)
			sum := sha256.Sum256([]byte(body))
			site.Drop(t, "orders-v.csv", body)
			site.Drop(t, "orders-v.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(body), hex.EncodeToString(sum[:])))
		}
		pair("V")
		w1 := newNode(t, pool, "w1", t.TempDir(), site)
		withFault(t, "apply:after_commit=error")
		w1.poll(t, "lost")
		fault.Set("")
		if err := os.Remove(filepath.Join(site.Root, "processing", "w1", "orders-v.csv")); err != nil {
			t.Fatal(err)
		}
		if err := w1.poll(t, "lost"); err != nil {
			t.Fatal(err)
		}
		if got := site.Files(t, "processing"); len(got) != 0 {
			t.Fatalf("processing/ still holds %v", got)
		}
		var kept bool
		for _, rel := range site.Files(t, "archive") {
			kept = kept || strings.HasSuffix(rel, ".complete")
		}
		if !kept {
			t.Fatalf("archive/ holds %v, want the lost file's manifest", site.Files(t, "archive"))
		}
		// the partner sends the name again, other bytes with a manifest
		// of their own: checked against that one (it agrees), the file is
		// the batch's second version, held for ops as any is
		pair("W")
		if err := w1.poll(t, "lost"); err != nil {
			t.Fatal(err)
		}
		fs := testenv.Files(t, pool, "lost")
		if len(fs) != 2 || fs[1].State != "quarantined" || fs[1].Reason != string(reason.BatchConflict) {
			t.Fatalf("got %+v, want the resend held as the batch's other version (its manifest agreeing)", fs)
		}
	})
	t.Run("before its bytes were spooled: failed as remote_lost", func(t *testing.T) {
		_, pool := testenv.DB(t)
		site := testenv.NewSite(t, "lost")
		site.Drop(t, "orders-v.csv", testenv.OrdersCSV("V", 5))
		w1 := newNode(t, pool, "w1", t.TempDir(), site)
		withFault(t, "download:mid=error")
		w1.d.PollOnce(context.Background(), "lost")
		if f := testenv.Files(t, pool, "lost")[0]; f.State != "claimed" {
			t.Fatalf("got %+v", f)
		}
		os.Remove(filepath.Join(site.Root, "processing", "w1", "orders-v.csv"))
		if err := w1.poll(t, "lost"); err != nil {
			t.Fatal(err)
		}
		f := testenv.Files(t, pool, "lost")[0]
		if f.State != "failed_terminal" || f.Reason != "remote_lost" {
			t.Fatalf("got %+v", f)
		}
		if n := testenv.Count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
			t.Fatal("rows were applied")
		}
	})
}

// Rows 13, 14, 15, 17: evidence without record, stale uploads, entries of
// ready/ that are never claimed, and a host key that changed are raised for
// a human; nothing is changed.
func TestFindingsThatNeedAHuman(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "odd")
	now := time.Now().UTC()
	old := now.Add(-7 * time.Hour)
	arch := filepath.Join(site.Root, "archive", now.Format("2006"), now.Format("01"))
	os.MkdirAll(arch, 0o755)
	os.WriteFile(filepath.Join(arch, "moved-by-hand.csv"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(site.Root, "quarantine"), 0o755)
	os.WriteFile(filepath.Join(site.Root, "quarantine", "77.orders-x.csv"), []byte("x"), 0o644)
	part := filepath.Join(site.Root, "incoming", "orders-late.csv.part")
	os.WriteFile(part, []byte("x"), 0o644)
	os.Chtimes(part, old, old)
	unknown := filepath.Join(site.Root, "ready", "unknown.txt") // left in ready/ for long: quarantining it failed
	os.WriteFile(unknown, []byte("x"), 0o644)
	os.Chtimes(unknown, old, old)
	os.WriteFile(filepath.Join(site.Root, "ready", "fresh.txt"), []byte("x"), 0o644) // the next poll quarantines it
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	fs := w1.reconcile(t)
	k := kinds(fs)
	if k[ledger.KindArchiveNoRecord] != 1 || k[ledger.KindStaleUpload] != 1 || k[ledger.KindUnclaimableReady] != 1 ||
		k[ledger.KindQuarantineNoRecord] != 1 {
		t.Fatalf("findings %+v", fs)
	}
	if !reconcile.NeedHuman(fs) {
		t.Fatal("nothing needs a human")
	}
	if err := testutil.GatherAndCompare(w1.reg, strings.NewReader(`
# HELP intake_stale_uploads Abandoned *.part uploads in incoming/ at the last reconciler run.
# TYPE intake_stale_uploads gauge
intake_stale_uploads{partner="odd"} 1
`), "intake_stale_uploads"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(unknown); err != nil {
		t.Fatal("the reconciler moved a file it only reports")
	}
	// a reload that removes the partner removes its gauges' series with
	// the next run: a removed partner's last count never alerts for ever
	w1.rec.SetPartners(nil)
	w1.reconcile(t)
	if n, err := testutil.GatherAndCount(w1.reg, "intake_stale_uploads", "intake_orphan_claims"); err != nil || n != 0 {
		t.Fatalf("%d series of a removed partner after a run (%v), want 0", n, err)
	}

	other, _ := sshdtest.WriteKey(filepath.Join(t.TempDir(), "k"))
	kh := filepath.Join(t.TempDir(), "kh")
	os.WriteFile(kh, []byte(knownhosts.Line([]string{site.Config.SFTP.Address}, other)+"\n"), 0o600)
	site.Config.SFTP.KnownHostsFile = kh
	w2 := newNode(t, pool, "w2", t.TempDir(), site)
	if fs := w2.reconcile(t); kinds(fs)[ledger.KindHostKeyMismatch] != 1 {
		t.Fatalf("findings %+v, want host_key_mismatch", fs)
	}
	// the mismatch is notified once per episode: a second run that finds
	// it again writes no second event
	w2.reconcile(t)
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox WHERE partner_id = 'odd' AND event = 'host_key_mismatch'`); n != 1 {
		t.Fatalf("%d host_key_mismatch events after two runs finding it, want 1", n)
	}
}

// Row 4: spool temp files of a dead download are deleted; fresh ones (a
// download in flight) are left alone.
func TestStaleSpoolTempFilesAreDeleted(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "tmp")
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	dir := filepath.Join(spoolDir, "tmp", "tmp")
	os.MkdirAll(dir, 0o750)
	stale, fresh := filepath.Join(dir, "w9.a.tmp"), filepath.Join(dir, "w9.b.tmp")
	os.WriteFile(stale, nil, 0o600)
	os.WriteFile(fresh, nil, 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	fs := w1.reconcile(t)
	if kinds(fs)[ledger.KindStaleSpoolTemp] != 1 {
		t.Fatalf("findings %+v", fs)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("stale temp file kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatal("a fresh temp file was deleted")
	}
}

// Only one reconciler acts at a time across replicas.
func TestOnlyOneReconcilerActsAtATime(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "lock")
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	conn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtextextended('partner-intake/reconcile', 0))`)
	if _, err := w1.rec.RunOnce(context.Background()); !errors.Is(err, reconcile.ErrNotLeader) {
		t.Fatalf("got %v, want ErrNotLeader", err)
	}
	conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtextextended('partner-intake/reconcile', 0))`)
	if _, err := w1.rec.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A group of small files (intake/group.go) stopped at each of its steps:
// every file ends archived, applied exactly once, with one ledger row and
// its own receipt. The group's transaction moves its files from spooled to
// applied together with their rows, so a commit without answer leaves
// each file spooled (nothing applied) or applied (all applied): the row
// says which, the next poll resumes from it, and nothing is marked
// outcome_unknown or guessed.
func TestGroupStoppedAtEachStepAppliesEveryFileOnce(t *testing.T) {
	for _, tt := range []struct {
		fault string
		// after is the state every file is in after the failed poll
		// ("" when the poll itself finishes them: the group's
		// transaction failed, and its files went on alone)
		after   string
		pollErr bool
	}{
		{"claim:after_rename", "", true},        // renamed, no rows: adopted (row 1)
		{"download:mid", "", false},             // one file's read fails: it goes on alone, the rest as a group
		{"spool:after", "spooled", true},        // spooled and recorded, nothing applied
		{"apply:mid_chunk", "", false},          // rolled back: every file goes on alone
		{"commit:lost", "spooled", false},       // never reached the server
		{"commit:reply_lost", "applied", false}, // landed, answer lost
		{"apply:after_commit", "applied", true},
		{"archive:mid", "applied", true}, // some files moved, none recorded
	} {
		t.Run(tt.fault, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "gf")
			prefixes := []string{"GA", "GB", "GC", "GD", "GE"}
			for i, p := range prefixes {
				site.Drop(t, "orders-"+string(rune('a'+i))+".csv", testenv.OrdersCSV(p, 10))
			}
			n := newNode(t, pool, "w1", t.TempDir(), site)
			withFault(t, tt.fault+"=error")
			err := n.poll(t, "gf")
			if tt.pollErr != errors.Is(err, fault.ErrInjected) {
				t.Fatalf("poll: %v, want the injected fault: %v", err, tt.pollErr)
			}
			if !tt.pollErr && err != nil {
				t.Fatal(err)
			}
			fs := testenv.Files(t, pool, "gf")
			if tt.after != "" {
				if len(fs) != len(prefixes) {
					t.Fatalf("%d rows after the fault, want %d", len(fs), len(prefixes))
				}
				for _, f := range fs {
					if f.State != tt.after {
						t.Fatalf("after %s: %+v, want every file %s", tt.fault, f, tt.after)
					}
				}
			}
			if tt.fault == "apply:mid_chunk" {
				for _, f := range fs {
					if f.State != "archived" {
						t.Fatalf("%+v: the group's files did not go on alone", f)
					}
				}
			}
			if err := n.poll(t, "gf"); err != nil {
				t.Fatal(err)
			}
			fs = testenv.Files(t, pool, "gf")
			if len(fs) != len(prefixes) {
				t.Fatalf("%d intake rows, want %d (one per file)", len(fs), len(prefixes))
			}
			for _, f := range fs {
				if f.State != "archived" || f.Applied != 10 || f.Total != 10 || f.Chunks != 1 || f.Receipt == "" || f.Archive == "" {
					t.Fatalf("%+v: want archived, 10 applied once, in one chunk, with a receipt", f)
				}
				if got := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE last_intake_id = $1`, f.ID); got != 10 {
					t.Fatalf("intake %d wrote %d target rows, want 10", f.ID, got)
				}
			}
			testenv.AssertExactOrders(t, pool, "gf", 10, prefixes...)
			if got := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk`); got != int64(len(prefixes)) {
				t.Fatalf("ledger holds %d chunks, want %d", got, len(prefixes))
			}
			for _, dir := range []string{"ready", "processing"} {
				if got := site.Files(t, dir); len(got) != 0 {
					t.Fatalf("%s/ holds %v", dir, got)
				}
			}
			if got := site.Files(t, "archive"); len(got) != len(prefixes) {
				t.Fatalf("archive/ holds %v", got)
			}
			if got := site.Files(t, "reports"); len(got) != len(prefixes) {
				t.Fatalf("reports/ holds %v, want one receipt per file", got)
			}
			if fs := n.reconcile(t); reconcile.NeedHuman(fs) || kinds(fs)[ledger.KindOutcomeUnknown] != 0 {
				t.Fatalf("findings %+v", fs)
			}
		})
	}
}

// A takeover whose move into the new owner's processing/ fails while the
// file is still where it was (here another entry holds the name there)
// points the row back at the file: the new owner archives that file from
// where it is. The move once counted whatever held the name as the file,
// and the row pointed at it; the file itself was left for a sweep to
// adopt as a second intake.
func TestATakeoverThatCannotMoveTheFileRunsItWhereItIs(t *testing.T) {
	_, pool := testenv.DB(t)
	site := bigSite(t, "nomove", 100)
	site.Drop(t, "orders-m.csv", testenv.OrdersCSV("M", 250))
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	w2 := newNode(t, pool, "w2", spoolDir, site)
	stoppedAt(t, w1, "nomove", "apply:after_commit")
	expireLeases(t, pool)
	// the name is taken in w2's processing/ (a directory: w2 holds it
	// unread, as anything there without a row, once it looks)
	if err := os.MkdirAll(filepath.Join(site.Root, "processing", "w2", "orders-m.csv"), 0o755); err != nil {
		t.Fatal(err)
	}
	fs := w2.reconcile(t)
	if k := kinds(fs); k[ledger.KindLeaseExpired] != 1 || k[ledger.KindRemoteMissing] != 0 {
		t.Fatalf("findings %+v, want one lease_expired and the file not called missing", fs)
	}
	var claimed string
	if err := pool.QueryRow(context.Background(), `SELECT claimed_path FROM file_intake`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(claimed, "/processing/w1/orders-m.csv") {
		t.Fatalf("the row points at %s, want the file where it still is", claimed)
	}
	if err := w2.poll(t, "nomove"); err != nil {
		t.Fatal(err)
	}
	f := testenv.Files(t, pool, "nomove")
	if len(f) != 2 || f[0].State != "archived" || f[0].Worker != "w2" || f[0].Applied != 250 ||
		f[1].State != "quarantined" || f[1].Reason != string(reason.NotRegularFile) {
		t.Fatalf("got %+v, want the file archived by w2 with its 250 rows, and the directory held", f)
	}
	rel, _ := filepath.Rel(site.Root, f[0].Archive)
	if site.Read(t, rel) != testenv.OrdersCSV("M", 250) {
		t.Fatal("the archive does not hold the file")
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	testenv.AssertExactOrders(t, pool, "nomove", 250, "M")
}

// Row 1 for a live worker's claim in progress: the reconciler's listing
// finds the file in the worker's processing dir between the claim's RENAME
// and its row. Its second look is made in the partner's claim section,
// after the claim's: the row is there, and nothing is reported. Before, a
// claim caught so raised an orphan_claim finding that needs a human.
func TestAClaimInProgressIsNoOrphan(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "busy")
	site.Drop(t, "orders-b.csv", testenv.OrdersCSV("B", 3))
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('w1', 'live', 1, '30 s', ARRAY['busy'], pg_catalog.now())`); err != nil {
		t.Fatal(err)
	}
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	w2 := newNode(t, pool, "w2", spoolDir, site)
	resume := pausedPoll(t, w1, "busy", "claim:after_rename")
	type result struct {
		fs  []ledger.Finding
		err error
	}
	done := make(chan result, 1)
	go func() {
		fs, err := w2.rec.RunOnce(ctx)
		done <- result{fs, err}
	}()
	var res result
	waiting := false
	for deadline := time.Now().Add(30 * time.Second); !waiting; {
		select {
		case res = <-done:
			resume()
			t.Fatalf("the run ended (%v) while the claim was in progress, findings %+v: want it to wait for the claim's section", res.err, res.fs)
		case <-time.After(20 * time.Millisecond):
		}
		waiting = testenv.Count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`) > 0
		if !waiting && time.Now().After(deadline) {
			resume()
			t.Fatal("the run never waited for the claim's section")
		}
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	res = <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if n := kinds(res.fs)[ledger.KindOrphanClaim]; n != 0 {
		t.Fatalf("findings %+v: a claim in progress reported", res.fs)
	}
	if f := testenv.Files(t, pool, "busy"); len(f) != 1 || f[0].Worker != "w1" || f[0].State != "archived" {
		t.Fatalf("rows %+v, want w1's one file archived", f)
	}
}

// Row 1 for an entry that is no file of a feed: a claim whose row was
// never written, whose entry is no longer a regular file (the partner
// swapped it between the listing and the RENAME), or whose name no feed
// matches any more (a feed re-patterned since), is held unread with a
// reason and a receipt, by whoever adopts it: the claimer's next poll, or
// for a gone claimer another worker's reconciler or sweep. Before, every
// adopter passed such an entry over and it stayed in processing/ for good.
func TestAClaimWithoutARowThatIsNoFileOfAFeedIsHeld(t *testing.T) {
	// gone: w1 stopped heartbeating a lease ago
	gone := func(t *testing.T, pool *pgxpool.Pool) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
			VALUES ('w1', 'gone', 1, '30 s', ARRAY['orph'], pg_catalog.now() - interval '1 hour')
			ON CONFLICT (worker_id) DO UPDATE SET last_seen = EXCLUDED.last_seen, drained_at = NULL`); err != nil {
			t.Fatal(err)
		}
	}
	heldOnce := func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, worker string, why reason.Code) {
		t.Helper()
		fs := testenv.Files(t, pool, "orph")
		if len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != string(why) || fs[0].Worker != worker {
			t.Fatalf("rows %+v, want one held %s by %s", fs, why, worker)
		}
		held := fmt.Sprintf("%d.%s", fs[0].ID, why)
		if _, err := os.Lstat(filepath.Join(site.Root, "quarantine", held)); err != nil {
			t.Fatalf("the entry is not held as %s: %v", held, err)
		}
		if got := site.Files(t, "quarantine"); !slices.Contains(got, sitefile.ReasonName(held)) {
			t.Fatalf("quarantine/ holds %v, want the reason file of %s", got, held)
		}
		if got := site.Files(t, "processing"); len(got) != 0 {
			t.Fatalf("processing/ still holds %v", got)
		}
		if testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'orph'`) != 0 {
			t.Fatal("rows of the held entry were applied")
		}
	}
	t.Run("swapped for a symlink, by the claimer's next poll", func(t *testing.T) {
		pool, site, w1 := claimWithoutRow(t)
		p := filepath.Join(site.Root, "processing", "w1", "orders-o.csv")
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/etc/passwd", p); err != nil {
			t.Fatal(err)
		}
		if err := w1.poll(t, "orph"); err != nil {
			t.Fatal(err)
		}
		heldOnce(t, pool, site, "w1", reason.NotRegularFile)
	})
	for _, by := range []string{"reconciler", "sweep"} {
		t.Run("its feed re-patterned, by another worker's "+by, func(t *testing.T) {
			pool, site, _ := claimWithoutRow(t)
			gone(t, pool)
			site.Config.Feeds[0].Pattern = `sales-.*\.csv`
			w2 := newNode(t, pool, "w2", t.TempDir(), site)
			if by == "reconciler" {
				if fs := w2.reconcile(t); kinds(fs)[ledger.KindOrphanClaim] != 1 {
					t.Fatalf("findings %+v", fs)
				}
			} else if err := w2.poll(t, "orph"); err != nil { // the sweep moves it; the next look adopts it
				t.Fatal(err)
			}
			if err := w2.poll(t, "orph"); err != nil {
				t.Fatal(err)
			}
			heldOnce(t, pool, site, "w2", reason.NoFeed)
		})
	}
}

// claimWithoutRow is partner orph's file orders-o.csv claimed by w1
// with no row: its claim failed right after the RENAME (row 1).
func claimWithoutRow(t *testing.T) (*pgxpool.Pool, *testenv.Site, *node) {
	t.Helper()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "orph")
	site.Drop(t, "orders-o.csv", testenv.OrdersCSV("O", 5))
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	stoppedAt(t, w1, "orph", "claim:after_rename")
	fault.Set("")
	if len(testenv.Files(t, pool, "orph")) != 0 || len(site.Files(t, "processing/w1")) != 1 {
		t.Fatal("want the file claimed with no row")
	}
	return pool, site, w1
}
