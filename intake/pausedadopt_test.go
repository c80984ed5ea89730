package intake_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// A replica restarted with a file in its own processing/<w2>/ lists that
// directory and pauses (SIGSTOP, a GC pause) at each point of its
// resume-and-adopt path. Meanwhile another replica takes the file over and
// finishes it: the reconciler of w3 takes over w2's live row once its
// lease expires (the file was left for a retry), or adopts the file that
// had no row at all (w2 died between its claim's RENAME and INSERT), and
// w3 applies and archives it (and archives the partner's resend of it as
// a duplicate). Then the paused replica goes on. It must act on what it
// sees again, not on its listing: no extra intake row, no receipt or
// reason file for anything the partner did not drop, nothing left in
// processing/.
func TestAPausedReplicaNeverAdoptsWhatAnotherTookOver(t *testing.T) {
	t.Run("live_row/resume_listed", func(t *testing.T) { pausedReplicaAdopts(t, true, "resume:listed") })
	for _, step := range []string{
		"resume:listed",        // after listing its own processing dir
		"resume:orphan",        // after deciding an entry has no live row
		"resume:before_insert", // in the claim section, file seen, row not yet inserted
	} {
		t.Run("no_row/"+strings.ReplaceAll(step, ":", "_"), func(t *testing.T) { pausedReplicaAdopts(t, false, step) })
	}
}

func pausedReplicaAdopts(t *testing.T, rowLeft bool, step string) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	const name = "orders-20261101.csv"
	if rowLeft {
		// w2 claims the file; its download fails, so its row stays
		// live, owned by w2, the file in processing/w2/
		site.Drop(t, name, goodRows("A", 5))
		if err := fault.Set("download:mid=error"); err != nil {
			t.Fatal(err)
		}
		first := newRig(t, pool, "w2", site)
		first.d.PollOnce(context.Background(), "acme") // fails at the fault
		fault.Set("")
		first.d.Stop()
		fs := files(t, pool, "acme")
		if len(fs) != 1 || fs[0].Worker != "w2" || strings.Contains("archived duplicate quarantined failed_terminal", fs[0].State) {
			t.Fatalf("after the failed download: %+v, want one live row of w2", fs)
		}
	} else {
		// w2 died between its claim's RENAME and the row's INSERT
		dir := filepath.Join(site.Root, "processing", "w2")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(goodRows("A", 5)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := site.Files(t, filepath.Join("processing", "w2")); len(got) != 1 || got[0] != name {
		t.Fatalf("processing/w2 holds %v, want %s", got, name)
	}

	// w2 again (a restart: it looks through its own dir), on a pool whose
	// sessions a stall inside a transaction ends, as the daemon's does
	w2pool := pausedPool(t, url)
	w2 := newRig(t, w2pool, "w2", site)
	resume := w2.pollPaused("acme", step)

	// meanwhile: w2's lease runs out, w3 takes the row over and finishes
	// the file, then the partner's resend of it
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET lease_until = now() - interval '1 second'
		WHERE partner_id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	w3 := newRig(t, pool, "w3", site)
	reconcileAs(t, pool, "w3", site)
	w3.poll("acme")
	site.Drop(t, name, goodRows("A", 5))
	w3.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[0].State != "archived" || fs[0].Worker != "w3" || fs[1].State != "duplicate" {
		t.Fatalf("w3 left %+v, want the file archived and its resend a duplicate", fs)
	}

	// w2 wakes up; a stall inside the claim section has cost it its
	// transaction, which is its error to report and never a row
	err := resume()
	if step != "resume:before_insert" && err != nil {
		t.Fatalf("w2's poll after the pause: %v", err)
	}
	w2.poll("acme") // and its next poll finds nothing to do either

	fs = files(t, pool, "acme")
	if len(fs) != 2 {
		t.Fatalf("intake rows %+v, want the file and its resend only", fs)
	}
	ids := map[int64]bool{fs[0].ID: true, fs[1].ID: true}
	for _, f := range fs {
		if f.State == "failed_terminal" || f.State == "quarantined" {
			t.Fatalf("row %+v: a partner-facing failure for a file that was accepted", f)
		}
	}
	var receipts int
	for _, rel := range site.Files(t, "reports") {
		if !strings.HasSuffix(rel, ".receipt.json") {
			continue
		}
		receipts++
		var rc sitefile.Receipt
		if err := json.Unmarshal([]byte(site.Read(t, filepath.Join("reports", rel))), &rc); err != nil {
			t.Fatalf("receipt %s: %v", rel, err)
		}
		if !ids[rc.IntakeID] || rc.Outcome == ledger.OutcomeFailed {
			t.Fatalf("receipt %s says intake %d %s: not an answer to a file the partner dropped", rel, rc.IntakeID, rc.Outcome)
		}
	}
	if receipts != 2 {
		t.Fatalf("%d receipts in reports/, want 2 (the file and its resend)", receipts)
	}
	if got := site.Files(t, "quarantine"); len(got) != 0 {
		t.Fatalf("quarantine/ holds %v", got)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	for _, f := range reconcileAs(t, pool, "w3", site) {
		if f.NeedsHuman {
			t.Fatalf("the reconciler finds %+v", f)
		}
	}
	if step != "resume:before_insert" {
		if got := testutil.ToFloat64(w2.d.Metrics().OrphansVanished.WithLabelValues("acme")); got != 1 {
			t.Fatalf("intake_orphan_claims_vanished_total = %v, want 1 (the entry w2 listed, gone when it looked again)", got)
		}
	}
}

// pausedPool is a pool whose sessions idle in a transaction are ended
// after two seconds (the daemon sets a lease's worth).
func pausedPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "2000"
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, p)
	return p
}

// The same for the other adopter: replica w1, polling the partner, is
// about to move a gone worker's entry without a row into its own dir
// (adoptFrom) and pauses inside the claim section; the reconciler of w3
// waits for the section (the stalled holder is ended a moment later),
// adopts the entry and w3 archives it. w1 goes on from where it was and
// adopts nothing: one row, one receipt, nothing left in processing/.
func TestAPausedReplicaNeverMovesWhatAnotherAdopted(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	// w2 died between its claim's RENAME and INSERT, and is gone
	goneWorkersClaim(t, pool, site, goodRows("M", 3))

	w1 := newRig(t, pausedPool(t, url), "w1", site)
	resume := w1.pollPaused("acme", "adopt:before_move")
	adoptedByAnother(t, pool, site, w1, resume, "archived")
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}

// A replica that renamed a hostile entry of ready/ into its processing
// dir pauses before recording it, past a lease; it is taken for gone and
// the reconciler of w3 adopts the entry, which w3 holds. The paused
// replica goes on: its rename and its row are one claim section, which
// was ended with its session, so it records no second row of the entry
// (nor holds, receipts or reports it again).
func TestAPausedReplicaRecordsNoHostileEntryAnotherAdopted(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "notes.txt", "no feed takes this name\n")
	w1 := newRig(t, pausedPool(t, url), "w1", site)
	resume := w1.pollPaused("acme", "claim:hostile_renamed")
	execArgs(t, pool, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('w1', 'paused', 1, '30 s', ARRAY['acme'], pg_catalog.now() - interval '1 hour')
		ON CONFLICT (worker_id) DO UPDATE SET last_seen = EXCLUDED.last_seen`)
	adoptedByAnother(t, pool, site, w1, resume, "quarantined")
}

// A reconciler that took an expired row over pauses before moving its
// file, past a lease: its claim section's session is ended. The takeover
// and its move are one step of the section, so the takeover is rolled
// back with it and the row still owns the file where it is: the next
// sweep of gone workers' dirs does not adopt the file as a second intake,
// the paused reconciler, waking, moves nothing, and the next reconciler
// run takes the row over and its replica finishes it. Committed before the move,
// the takeover left a row naming a path the file never reached, and the
// sweep recorded the file again.
func TestAReconcilerPausedBeforeItsMoveLeavesTheRowAsItWas(t *testing.T) {
	url, pool := testenv.DB(t)
	site, _ := leftInFlight(t, pool)
	// w2 is gone
	execArgs(t, pool, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('w2', 'gone', 1, '30 s', ARRAY['acme'], pg_catalog.now() - interval '1 hour')
		ON CONFLICT (worker_id) DO UPDATE SET last_seen = EXCLUDED.last_seen, drained_at = NULL`)

	// w4's reconciler takes the row over and pauses before the move
	done := pausedReconciler(t, url, site, 30*time.Second, "takeover:before_move")

	// w3 sweeps gone workers' dirs, waiting for w4's section until its
	// session is ended
	w3 := newRig(t, pool, "w3", site)
	w3.poll("acme")
	fault.Resume("takeover:before_move")
	<-done // its section was ended: an error of its run, never a move
	// then (w4's run, the leader, over) w3's reconciler takes the row
	// over, and w3 runs the file
	reconcileAs(t, pool, "w3", site)
	w3.d.TakenOver("acme") // the reconciler's hint to its own replica
	w3.poll("acme")

	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w3" {
		t.Fatalf("rows %+v, want the one file archived by w3", fs)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}

// A takeover's move that outlasts a lease (a RENAME the site makes as a
// copy of a large file) keeps its claim section: the section's
// transaction is kept from idling out while the move runs, so the
// takeover commits after it. Idle that long, the section was ended and
// the file left moved under a row that still named its old path. The
// lease it grants runs from its commit: granted from the section's start,
// it had run out before the commit, and any replica could take the file
// over again at once.
func TestATakeoversLongMoveKeepsItsSection(t *testing.T) {
	url, pool := testenv.DB(t)
	ctx := context.Background()
	site, name := leftInFlight(t, pool)

	// w4's reconciler, on a pool whose transactions idle 2 s are ended,
	// is held in its move
	done := pausedReconciler(t, url, site, 3*time.Second, "takeover:moving")
	// its section's transaction lives past the idle timeout
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE datname = pg_catalog.current_database() AND xact_start < pg_catalog.now() - interval '3 seconds'
			  AND query = 'SELECT 1'`) > 0
	}, func() string { return "the section's transaction did not outlive the idle timeout" })
	fault.Resume("takeover:moving")
	if err := <-done; err != nil {
		t.Fatalf("the reconciler's run: %v", err)
	}
	if fs := files(t, pool, "acme"); len(fs) != 1 || fs[0].Worker != "w4" {
		t.Fatalf("rows %+v, want the file taken over by w4", fs)
	}
	if got := site.Files(t, filepath.Join("processing", "w4")); len(got) != 1 || got[0] != name {
		t.Fatalf("processing/w4 holds %v, want the file the takeover moved", got)
	}
	var claimed string
	if err := pool.QueryRow(ctx, `SELECT claimed_path FROM file_intake WHERE partner_id = 'acme'`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(claimed, "/processing/w4/"+name) {
		t.Fatalf("the row names %s, want the file where the move put it", claimed)
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'acme' AND lease_until > pg_catalog.now()`); n != 1 {
		t.Fatal("the takeover's lease had run out by its commit")
	}
}

// A takeover whose run is stopped (or whose partner's deadline passes)
// once its move has landed commits with the move: the row names the file
// where the move put it. Rolled back with the run's context, the row named
// the old path while the file lay in the reconciler's processing/ with no
// row, where it was adopted as a second intake.
func TestATakeoverStoppedAfterItsMoveCommitsWithIt(t *testing.T) {
	url, pool := testenv.DB(t)
	site, name := leftInFlight(t, pool)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := pausedReconcilerRun(t, ctx, url, site, 30*time.Second, "takeover:moved")
	cancel() // the run is stopped with the file moved
	fault.Resume("takeover:moved")
	<-done // the run's error (stopped) or none
	var claimed string
	if err := pool.QueryRow(context.Background(), `SELECT claimed_path FROM file_intake WHERE partner_id = 'acme'`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if got := site.Files(t, filepath.Join("processing", "w4")); len(got) != 1 || got[0] != name {
		t.Fatalf("processing/w4 holds %v, want the file the takeover moved", got)
	}
	if !strings.HasSuffix(claimed, "/processing/w4/"+name) {
		t.Fatalf("the row names %s, want the file where the move put it", claimed)
	}
}

// A reconciler paused past a lease between its look at a gone worker's
// claim without a row and its rename loses its claim section and renames
// nothing: the worker, back meanwhile, adopted the file in a section of
// its own (after the server ended the reconciler's) and runs it where it
// lies. Renamed on what the reconciler saw before, the file left the
// worker's dir under the worker's row.
func TestAReconcilerPausedBeforeAnAdoptionMovesNothing(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	// w2 renamed the file into its processing dir and died before its row
	goneWorkersClaim(t, pool, site, goodRows("A", 5))
	done := pausedReconcilerRun(t, context.Background(), url, site, 30*time.Second, "adopt_gone:before_move", "download:mid")

	// w2 comes back: its poll adopts the file from its own dir, once the
	// server has ended the paused reconciler's section, and stops in the
	// file's download
	w2 := newRig(t, pool, "w2", site)
	t.Cleanup(func() { fault.Resume("download:mid") }) // before the rig's stop, which waits for the poll
	polled := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		polled <- w2.d.PollOnce(ctx, "acme")
	}()
	select {
	case <-fault.Paused("download:mid"):
	case <-time.After(30 * time.Second):
		t.Fatal("w2 never reached its download")
	}
	fault.Resume("adopt_gone:before_move")
	<-done
	if got := site.Files(t, filepath.Join("processing", "w4")); len(got) != 0 {
		t.Fatalf("the paused reconciler moved %v out of w2's dir", got)
	}
	fault.Resume("download:mid")
	if err := <-polled; err != nil {
		t.Fatalf("w2's poll: %v", err)
	}
	if fs := files(t, pool, "acme"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w2" {
		t.Fatalf("rows %+v, want the one file archived by w2", fs)
	}
}

// goneWorkersClaim is a claim of orders-20261101.csv with rows that w2
// renamed into its processing dir before it died without its row; w2's
// replica row says it is gone.
func goneWorkersClaim(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, rows string) {
	t.Helper()
	dir := filepath.Join(site.Root, "processing", "w2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "orders-20261101.csv"), []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	execArgs(t, pool, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('w2', 'gone', 1, '30 s', ARRAY['acme'], pg_catalog.now() - interval '1 hour')`)
}

// leftInFlight is a file w2 claimed and left in flight: its download
// failed, so its row stays live (its lease run out), the file in
// processing/w2/.
func leftInFlight(t *testing.T, pool *pgxpool.Pool) (*testenv.Site, string) {
	t.Helper()
	site := testenv.NewSite(t, "acme")
	const name = "orders-20261101.csv"
	site.Drop(t, name, goodRows("A", 5))
	if err := fault.Set("download:mid=error"); err != nil {
		t.Fatal(err)
	}
	w2 := newRig(t, pool, "w2", site)
	w2.d.PollOnce(context.Background(), "acme") // fails at the fault
	fault.Set("")
	w2.d.Stop()
	execArgs(t, pool, `UPDATE file_intake SET lease_until = pg_catalog.now() - interval '1 second' WHERE partner_id = 'acme'`)
	return site, name
}

// pausedReconciler runs a reconciler of w4 once, on a pool whose
// transactions idle 2 s are ended (pausedPool), paused at the fault step:
// it returns once the run reached it, and the run's end is on the channel
// (the step is resumed at the test's end if the test does not).
func pausedReconciler(t *testing.T, url string, site *testenv.Site, lease time.Duration, step string) <-chan error {
	t.Helper()
	return pausedReconcilerRun(t, context.Background(), url, site, lease, step)
}

// pausedReconcilerRun is pausedReconciler whose run is under ctx, with
// the later steps armed to pause too (one spec: arming again would let go
// of a step already paused).
func pausedReconcilerRun(t *testing.T, ctx context.Context, url string, site *testenv.Site, lease time.Duration, step string, later ...string) <-chan error {
	t.Helper()
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{}, "w4", lease, pausedPool(t, url), sp,
		[]partners.Config{site.Validated(t)}, prometheus.NewRegistry(), testenv.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Stop)
	spec := step + "=pause"
	for _, l := range later {
		spec += "," + l + "=pause"
	}
	if err := fault.Set(spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	t.Cleanup(func() { // first: a run still paused goes on
		for _, s := range append([]string{step}, later...) {
			fault.Resume(s)
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := rec.RunOnce(ctx)
		done <- err
	}()
	select {
	case <-fault.Paused(step):
	case <-time.After(30 * time.Second):
		t.Fatalf("the reconciler never reached %s", step)
	}
	return done
}

// adoptedByAnother: while w1 is paused inside its claim section, the
// reconciler of w3 (waiting for w1's section until its session is ended)
// adopts the entry and w3 takes it to state; then w1 goes on (its
// section's transaction was ended: an error of its poll, never a row) and
// polls again. One row and one receipt stay.
func adoptedByAnother(t *testing.T, pool *pgxpool.Pool, site *testenv.Site, w1 *rig, resume func() error, state string) {
	t.Helper()
	w3 := newRig(t, pool, "w3", site)
	reconcileAs(t, pool, "w3", site)
	w3.poll("acme")
	if fs := files(t, pool, "acme"); len(fs) != 1 || fs[0].State != state || fs[0].Worker != "w3" {
		t.Fatalf("w3 left %+v, want the entry adopted by w3, %s", fs, state)
	}
	_ = resume()
	w1.poll("acme")
	if fs := files(t, pool, "acme"); len(fs) != 1 {
		t.Fatalf("rows %+v, want the one entry's only", fs)
	}
	var receipts int
	for _, rel := range site.Files(t, "reports") {
		if strings.HasSuffix(rel, ".receipt.json") {
			receipts++
		}
	}
	if receipts != 1 {
		t.Fatalf("%d receipts, want 1", receipts)
	}
}
