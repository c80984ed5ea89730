package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// One live process per worker id (intake/workerid.go). A second process
// of the same id (a second daemon with the same config, `run --once`
// beside the host's daemon) took the first's file over in the middle of
// it, as a restarted replica takes its own leftovers: the first was fenced
// and the file done twice. Now the second polls nothing while the first
// lives, and the first's file ends as it began.
func TestASecondProcessOfAWorkerIDTakesNothingOver(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wid")
	r1 := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("W", 5))
	resume := r1.pollPaused("wid", "publish:archive")
	f := files(t, pool, "wid")[0]
	token := fencingToken(t, pool, f.ID)

	r2 := newRig(t, pool, "w1", site)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := r2.d.PollOnce(ctx, "wid")
	var inUse *ledger.WorkerIDInUseError
	if !errors.As(err, &inUse) || !strings.Contains(err.Error(), "worker_id_in_use") || !strings.Contains(inUse.Holder, "PostgreSQL backend") {
		t.Fatalf("second process's poll: %v, want worker_id_in_use naming the holder", err)
	}
	if got := fencingToken(t, pool, f.ID); got != token {
		t.Fatalf("the second process took the file over (token %d -> %d)", token, got)
	}
	if n := testutil.ToFloat64(r2.d.Metrics().WorkerIDHeld); n != 0 {
		t.Fatalf("second process: intake_worker_id_held %v, want 0", n)
	}
	if err := resume(); err != nil {
		t.Fatalf("the first process's poll: %v", err)
	}
	f = files(t, pool, "wid")[0]
	if f.State != "archived" || f.Applied != 5 || fencingToken(t, pool, f.ID) != token {
		t.Fatalf("%+v (token %d), want archived by the first process under token %d", f, fencingToken(t, pool, f.ID), token)
	}
	if n := testutil.ToFloat64(r1.d.Metrics().WorkerIDHeld); n != 1 {
		t.Fatalf("first process: intake_worker_id_held %v, want 1", n)
	}
	// the first lets the id go: the second runs as it
	r1.d.Stop()
	site.Drop(t, "orders-2.csv", goodRows("X", 3))
	r2.poll("wid")
	if fs := files(t, pool, "wid"); len(fs) != 2 || fs[1].State != "archived" || fs[1].Worker != "w1" {
		t.Fatalf("after the first stopped: %+v, want the second file archived by the second process", fs)
	}
}

// A process whose worker id lock's session ended (a PostgreSQL restart, a
// cut connection) publishes nothing while another process holds the id:
// that one may have taken its files over at once. Before, a step whose
// fence had passed went on, and a group's fence stood for a third of a
// lease. When the id is free again the process takes it and its file ends.
func TestAProcessThatLostItsWorkerIDPublishesNothing(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wlost")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("L", 4))
	resume := r.pollPaused("wlost", "publish:archive")
	other := takeWorkerIDOver(t, pool, "w1")
	waitFor(t, "the process to see its worker id taken", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 0 })
	resume() // the poll fails or ends; what it published is what counts
	f := files(t, pool, "wlost")[0]
	if f.State != "applied" || f.Archive != "" {
		t.Fatalf("%+v, want applied and not archived: a process without its worker id publishes nothing", f)
	}
	if ents, _ := os.ReadDir(filepath.Join(site.Root, "processing", "w1")); len(ents) != 1 {
		t.Fatalf("processing/w1 holds %d files, want the claimed file still there", len(ents))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.d.PollOnce(ctx, "wlost"); err == nil {
		t.Fatal("a poll ran while another process held the worker id")
	}
	// the other process ends: the lock is taken again, and the file ends
	// on the next poll
	other.Close(context.Background())
	waitFor(t, "the worker id held again", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1 })
	r.poll("wlost")
	if f := files(t, pool, "wlost")[0]; f.State != "archived" || f.Applied != 4 {
		t.Fatalf("%+v, want archived once the id is held again", f)
	}
}

// A group's fence stands for its burst of moves and receipts for up to a
// third of a lease; it stands only under the hold of the worker id it was
// taken in, and the burst's poll ends with that hold. A process that lost
// its id and took it again (nobody else held it that moment, as far as it
// knows) publishes nothing of that burst: another process of the id may
// have taken its files over in between. Its next poll ends them.
func TestAGroupsFenceDoesNotOutliveTheHoldItWasTakenIn(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wgrp")
	r := newRig(t, pool, "w1", site)
	for i := 1; i <= 3; i++ {
		site.Drop(t, fmt.Sprintf("orders-%d.csv", i), goodRows(fmt.Sprintf("G%d", i), 2))
	}
	resume := r.pollPaused("wgrp", "publish:archive")
	before := lockBackend(t, pool, "w1")
	endWorkerLockSession(t, pool, "w1")
	waitFor(t, "the worker id taken again", func() bool {
		b := lockBackend(t, pool, "w1")
		return b != 0 && b != before && testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1
	})
	resume()
	if got := grouped(r, "wgrp", "grouped"); got != 3 {
		t.Fatalf("%v files went through a group, want 3", got)
	}
	archived := 0
	for _, f := range files(t, pool, "wgrp") {
		if f.State == "archived" {
			archived++
		}
	}
	// the paused file's step came after the loss (the others' steps may
	// have been under way then, and ended with the poll)
	if archived == 3 {
		t.Fatal("every file archived: the paused file published under a group fence taken in a hold since lost")
	}
	r.poll("wgrp")
	for _, f := range files(t, pool, "wgrp") {
		if f.State != "archived" {
			t.Fatalf("%+v after the next poll, want archived", f)
		}
	}
}

// A process that loses its worker id in the middle of a poll takes no
// further file as the id's: it resumed the id's files at once (a restarted
// replica's leftovers), and another process of the id may be running them
// now. The file under way goes on to its fence and publishes nothing.
func TestAProcessThatLostItsWorkerIDTakesNoFurtherFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wmid")
	site.Config.Concurrency = 1
	r := newRig(t, pool, "w1", site)
	// two files claimed by w1 before a crash, without rows: the poll
	// adopts both and resumes them one after the other (one slot: the
	// second waits for it while the first is under way)
	dir := filepath.Join(site.Root, "processing", "w1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, prefix := range []string{"M", "N"} {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("orders-%d.csv", i+1)), []byte(goodRows(prefix, 3)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resume := r.pollPaused("wmid", "spool:after")
	other := takeWorkerIDOver(t, pool, "w1")
	waitFor(t, "the process to see its worker id taken", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 0 })
	resume()
	fs := files(t, pool, "wmid")
	if len(fs) != 2 {
		t.Fatalf("%d rows, want the two adopted files", len(fs))
	}
	if fs[0].State == "archived" {
		t.Fatalf("%+v: the file under way published after the loss", fs[0])
	}
	if fs[1].State != "claimed" || fencingToken(t, pool, fs[1].ID) != 1 {
		t.Fatalf("%+v (token %d): the second file was resumed after the process lost its worker id", fs[1], fencingToken(t, pool, fs[1].ID))
	}
	other.Close(context.Background())
	waitFor(t, "the worker id held again", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1 })
	r.poll("wmid")
	for _, f := range files(t, pool, "wmid") {
		if f.State != "archived" || f.Applied != 3 {
			t.Fatalf("%+v, want archived once the id is held again", f)
		}
	}
}

// A daemon started while another live process holds its worker id polls
// nothing and does not register (the holder's registration stands) until
// the id is free; then it registers and runs.
func TestADaemonWaitsForItsWorkerIDToBeFree(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wwait")
	site.Config.Poll = "@every 1s"
	holder := newRig(t, pool, "w1", site)
	holder.poll("wwait") // takes the id (PollOnce; a one-shot run registers nothing)
	r := newRig(t, pool, "w1", site)
	polled := &intake.Signals(r.d).Polled
	polled.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", goodRows("A", 2))
	polled.Clear()
	for range 3 { // three of the partner's polls ended since the file was dropped
		if p := polled.WaitFor(func(p intake.PollDone) bool { return p.Partner == "wwait" }); p.Err != nil {
			t.Fatalf("a poll while waiting for the worker id: %v", p.Err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'wwait'`); n != 0 {
		t.Fatalf("%d files claimed while another process held the worker id", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = 'w1'`); n != 0 {
		t.Fatal("the waiting daemon registered the worker id another process holds")
	}
	if n := testutil.ToFloat64(r.d.Metrics().WorkerIDHeld); n != 0 {
		t.Fatalf("intake_worker_id_held %v while waiting, want 0", n)
	}
	holder.d.Stop()
	waitFor(t, "the file archived by the daemon that waited", func() bool {
		fs := files(t, pool, "wwait")
		return len(fs) == 1 && fs[0].State == "archived"
	})
	if n := count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = 'w1'`); n != 1 {
		t.Fatal("the daemon holding its worker id did not register")
	}
}

// A one-shot run holds its worker id on a connection of its pool (no
// second backend beside its logins). The hold refuses a second process of
// the id like any other. No watcher checks it: each step that takes a file
// as the id's asks the database first, and takes the lock again when that
// connection's session ended (the pool closes a connection whose statement
// was cancelled); each fence asks whether that connection still holds it,
// so a run whose lock another process holds now publishes nothing.
func TestAOneShotRunsHoldOnItsPoolIsCheckedByEveryStep(t *testing.T) {
	_, shared := testenv.DB(t)
	pool := namedPool(t, shared, "w1") // the daemon's own: the test works on its connections
	site := testenv.NewSite(t, "wpool")
	r := newRig(t, pool, "w1", site)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.HoldWorkerIDOnPool(ctx); err != nil {
		t.Fatal(err)
	}
	second := newRig(t, shared, "w1", site)
	var inUse *ledger.WorkerIDInUseError
	if err := second.d.PollOnce(ctx, "wpool"); !errors.As(err, &inUse) {
		t.Fatalf("a second process beside the pooled hold: %v, want worker_id_in_use", err)
	}
	// the lock's connection ends; nobody else takes the id: the next
	// claim takes the lock again and the run goes on
	before := lockBackend(t, shared, "w1")
	endWorkerLockSession(t, shared, "w1")
	site.Drop(t, "orders-1.csv", goodRows("P", 3))
	r.d.PollOnce(ctx, "wpool") // may meet the ended connection first, as any statement would
	r.poll("wpool")
	if f := files(t, shared, "wpool")[0]; f.State != "archived" {
		t.Fatalf("%+v after the lock's connection ended, want archived (the lock taken again)", f)
	}
	if after := lockBackend(t, shared, "w1"); after == 0 || after == before {
		t.Fatalf("lock held by backend %d (before %d), want it taken again on another", after, before)
	}
	// the pool's connection stops holding the lock without ending (as a
	// session reset would) and another process of w1 takes it: no
	// connection closes, only the database can tell
	site.Drop(t, "orders-2.csv", goodRows("Q", 3))
	resume := r.pollPaused("wpool", "publish:archive")
	for _, c := range pool.AcquireAllIdle(ctx) {
		c.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('partner-intake/worker/' || $1, 0))`, "w1")
		c.Release()
	}
	other, err := pgx.Connect(ctx, shared.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	var got bool
	if err := other.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('partner-intake/worker/' || $1, 0))`, "w1").Scan(&got); err != nil || !got {
		t.Fatalf("take the worker id over: %v %v", got, err)
	}
	resume()
	if f := files(t, shared, "wpool")[1]; f.State == "archived" {
		t.Fatalf("%+v: published while another session held the worker id", f)
	}
	site.Drop(t, "orders-3.csv", goodRows("R", 3))
	if err := r.d.PollOnce(ctx, "wpool"); err == nil || !strings.Contains(err.Error(), "worker_id_in_use") {
		t.Fatalf("a poll while another session holds the id: %v, want worker_id_in_use", err)
	}
	if fs := files(t, shared, "wpool"); len(fs) != 2 {
		t.Fatalf("%d files, want orders-3.csv left unclaimed while another session holds the id", len(fs))
	}
}

// A one-shot run whose lock's connection ends while a file is under way
// (the pool closes a connection whose statement was cancelled: an apply
// ahead abandoned) and no other process takes the id meanwhile: the
// file's next fence takes the lock again and the file is archived, not
// left applied for a reconciler to find a lease later. The file's token
// still fences a takeover made while the id was free: another process
// of the id that resumed it in that window leaves this run nothing to
// publish.
func TestAOneShotRunsFileOutlivesItsLocksConnection(t *testing.T) {
	_, shared := testenv.DB(t)
	pool := namedPool(t, shared, "w1")
	site := testenv.NewSite(t, "wmid2")
	r := newRig(t, pool, "w1", site)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.HoldWorkerIDOnPool(ctx); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", goodRows("M", 3))
	resume := r.pollPaused("wmid2", "publish:archive")
	before := lockBackend(t, shared, "w1")
	endWorkerLockSession(t, shared, "w1")
	if err := resume(); err != nil {
		t.Fatalf("the poll whose lock's connection ended under its file: %v", err)
	}
	if f := files(t, shared, "wmid2")[0]; f.State != "archived" {
		t.Fatalf("%+v, want archived: the lock taken again at the archive's fence", f)
	}
	if after := lockBackend(t, shared, "w1"); after == 0 || after == before {
		t.Fatalf("lock held by backend %d (before %d), want it taken again on another", after, before)
	}

	// the same, but another process of the id resumes the file while the
	// id is free: the run's fence finds the token moved and publishes
	// nothing
	site.Drop(t, "orders-2.csv", goodRows("N", 3))
	resume = r.pollPaused("wmid2", "publish:archive")
	endWorkerLockSession(t, shared, "w1")
	execArgs(t, shared, `UPDATE file_intake SET fencing_token = fencing_token + 1 WHERE partner_id = 'wmid2' AND state = 'applied'`)
	resume()
	f := files(t, shared, "wmid2")[1]
	if f.State == "archived" {
		t.Fatalf("%+v: published although another process took the file over", f)
	}
	if got := site.Files(t, "archive"); len(got) != 1 {
		t.Fatalf("archive/ holds %v, want the first file alone: the file taken over was moved", got)
	}
}

// A daemon that lost its worker id and takes it again registers again
// before it polls: the process that held the id meanwhile may have retired
// the id's row on its way out, and the other replicas would then take this
// one's partners and adopt its claims not yet recorded.
func TestADaemonThatTakesItsWorkerIDAgainRegistersFirst(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wreg")
	r := newRig(t, pool, "w1", site)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	other := takeWorkerIDOver(t, pool, "w1")
	waitFor(t, "the daemon to see its worker id taken", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 0 })
	// the other process of w1 stops, retiring the id's row (RetireWorker)
	execArgs(t, pool, `UPDATE intake_worker SET last_seen = now() - lease - interval '1 second', drained_at = now() WHERE worker_id = $1`, "w1")
	other.Close(context.Background())
	waitFor(t, "the worker id held again", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1 })
	if n := count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = 'w1' AND drained_at IS NULL AND last_seen > now() - interval '10 seconds'`); n != 1 {
		t.Fatal("the daemon holds its worker id again, but the id's row still says it is gone")
	}
}

// A worker id of 63 characters (its rule's longest) has connections whose
// application_name PostgreSQL stores as intake gives it: a takeover ends a
// stalled owner's sessions by that name (Ledger.TakeOver). PostgreSQL
// cuts a name at 63 bytes, and "partner-intake/" + such an id was cut: a
// stalled owner with a long id was never ended, and its file never taken
// over. Two ids alike in their first 48 characters keep two names.
func TestALongWorkerIDsSessionsAreFoundByTheirName(t *testing.T) {
	url, _ := testenv.DB(t)
	a := strings.Repeat("a", 62) + "1"
	b := strings.Repeat("a", 62) + "2"
	if ledger.AppName(a) == ledger.AppName(b) || len(ledger.AppName(a)) > 63 {
		t.Fatalf("AppName %q / %q: want two names of at most 63 bytes", ledger.AppName(a), ledger.AppName(b))
	}
	if short := ledger.AppName("w1"); short != "partner-intake/w1" {
		t.Fatalf("AppName(w1) = %q", short)
	}
	pc, err := intake.PoolConfig(url, a, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var stored string
	if err := p.QueryRow(context.Background(), `SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != ledger.AppName(a) {
		t.Fatalf("application_name stored %q, intake looks for %q", stored, ledger.AppName(a))
	}
}

func fencingToken(t *testing.T, pool *pgxpool.Pool, id int64) int64 {
	t.Helper()
	var tok int64
	if err := pool.QueryRow(context.Background(), `SELECT fencing_token FROM file_intake WHERE intake_id = $1`, id).Scan(&tok); err != nil {
		t.Fatal(err)
	}
	return tok
}

// endWorkerLockSession ends the database session holding the worker id's
// lock, as a PostgreSQL restart or a cut connection would.
func endWorkerLockSession(t *testing.T, pool *pgxpool.Pool, worker string) {
	t.Helper()
	var ended int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(l.pid, 5000)) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended('partner-intake/worker/' || $1, 0)`, worker).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != 1 {
		t.Fatalf("ended %d sessions holding worker %s's lock, want 1", ended, worker)
	}
}

// takeWorkerIDOver ends the session holding the worker id's lock (as a
// PostgreSQL restart or a cut connection would) and takes the lock on a
// session of its own at once, as another process of the id would; closing
// the returned connection lets it go.
func takeWorkerIDOver(t *testing.T, pool *pgxpool.Pool, worker string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	// queued for the lock before its holder's session ends, this session
	// is granted it first (the holder's retake waits behind it)
	took := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtextextended('partner-intake/worker/' || $1, 0))`, worker)
		took <- err
	}()
	waitFor(t, "the test's session waiting for the lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended('partner-intake/worker/' || $1, 0)`, worker) == 1
	})
	endWorkerLockSession(t, pool, worker)
	if err := <-took; err != nil {
		t.Fatalf("take the worker id over: %v", err)
	}
	return conn
}

// lockBackend is the backend pid holding the worker id's lock, 0 if none.
func lockBackend(t *testing.T, pool *pgxpool.Pool, worker string) int64 {
	t.Helper()
	var pid int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(l.pid), 0) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended('partner-intake/worker/' || $1, 0)`, worker).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, ok, testenv.Says(what))
}

// A daemon of w1 stops drained; then a one-shot run of w1 (`run --once`,
// which never registers) is killed between its claim's RENAME and its
// INSERT; then w1's daemon starts again, twice. A drained stop recorded
// before the one-shot run must not make the daemon trust that nothing of
// w1 waits in its processing dir: the file is adopted and applied on the
// first start's poll. Likewise for an id no daemon ever registered.
func TestAOneShotRunsClaimWithoutARowIsAdoptedByTheNextStart(t *testing.T) {
	for _, registered := range []bool{true, false} {
		t.Run(fmt.Sprintf("daemon_ran_before=%v", registered), func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "once")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if registered {
				d := newRig(t, pool, "w1", site)
				if err := d.d.Start(ctx); err != nil {
					t.Fatal(err)
				}
				d.poll("once")
				d.d.Stop()
				var drained bool
				if err := pool.QueryRow(ctx, `SELECT drained_at IS NOT NULL FROM intake_worker WHERE worker_id = 'w1'`).Scan(&drained); err != nil || !drained {
					t.Fatalf("the daemon's clean stop: drained %v, %v", drained, err)
				}
			}

			site.Drop(t, "orders-1.csv", goodRows("O", 3))
			// its own pool, named as the daemon's (so the rig runs on it,
			// not on a copy), closed below as its process's end would
			oc := pool.Config().Copy()
			oc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName("w1")
			oncePool, err := pgxpool.NewWithConfig(ctx, oc)
			if err != nil {
				t.Fatal(err)
			}
			once := newRig(t, oncePool, "w1", site)
			if err := once.d.HoldWorkerIDOnPool(ctx); err != nil {
				t.Fatal(err)
			}
			if err := fault.Set("claim:after_rename=error"); err != nil {
				t.Fatal(err)
			}
			if err := once.d.PollOnce(ctx, "once"); err == nil {
				t.Fatal("the one-shot poll went past its claim's RENAME")
			}
			fault.Set("")
			once.d.Stop()
			oncePool.Close() // as a kill: no row, nothing recorded of the run, its sessions gone
			if got := site.Files(t, filepath.Join("processing", "w1")); len(got) != 1 {
				t.Fatalf("processing/w1 holds %v, want the claimed file", got)
			}
			if fs := files(t, pool, "once"); len(fs) != 0 {
				t.Fatalf("rows %+v, want none (the claim's INSERT never ran)", fs)
			}

			for start := 1; start <= 2; start++ {
				d := newRig(t, pool, "w1", site)
				if err := d.d.Start(ctx); err != nil {
					t.Fatal(err)
				}
				d.poll("once")
				d.d.Stop()
			}
			fs := files(t, pool, "once")
			if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 3 {
				t.Fatalf("rows %+v, want the file adopted and archived", fs)
			}
			if got := site.Files(t, "processing"); len(got) != 0 {
				t.Fatalf("processing/ still holds %v", got)
			}
		})
	}
}

// A daemon that lost its worker id while another process of the id ran
// (and died between a claim's RENAME and its INSERT) looks through its
// processing dir again once it holds the id again, though it had looked
// before: the claim without a row is adopted on its next poll.
func TestADaemonThatTakesItsWorkerIDAgainLooksForClaimsWithoutARow(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wback")
	r := newRig(t, pool, "w1", site)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.poll("wback") // looked through: settled
	claimWithoutRowWhileIDTaken(t, pool, r, site)
	r.poll("wback")
	fs := files(t, pool, "wback")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim without a row adopted and archived", fs)
	}
}

// The same, stopped before the partner's next poll: the hint to look
// again is not lost with the run. The stop is not recorded drained, so
// the next start looks through its processing dir and adopts the claim.
func TestAStopBeforeTheLookAgainIsNotDrained(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wstop")
	site.Config.Poll = "@every 1h" // no poll after the first
	r := newRig(t, pool, "w1", site)
	intake.Signals(r.d).Polled.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	intake.Signals(r.d).Polled.WaitOrTimeout() // looked through: settled
	claimWithoutRowWhileIDTaken(t, pool, r, site)
	r.d.Stop()

	r2 := newRig(t, pool, "w1", site)
	intake.Signals(r2.d).Polled.Init(t)
	if err := r2.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	intake.Signals(r2.d).Polled.WaitOrTimeout()
	if fs := files(t, pool, "wstop"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim without a row adopted and archived by the next start", fs)
	}
}

// claimWithoutRowWhileIDTaken: another process takes r's worker id (w1)
// over, claims a file into w1's processing dir and dies before its row;
// r's daemon then holds its id again.
func claimWithoutRowWhileIDTaken(t *testing.T, pool *pgxpool.Pool, r *rig, site *testenv.Site) {
	t.Helper()
	other := takeWorkerIDOver(t, pool, "w1")
	waitFor(t, "the daemon to see its worker id taken", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 0 })
	dir := filepath.Join(site.Root, "processing", "w1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "orders-1.csv"), []byte(goodRows("B", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	other.Close(context.Background())
	waitFor(t, "the worker id held again", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1 })
}

// A process registers and retires its worker id's row only while its own
// lock session holds the id: one that lost the id after its last look at
// its hold writes nothing into the row of the process that took the id,
// whose pid may be its own (PID 1 in two containers; here both are this
// test's), and leaves it live and not drained. The holder's retire goes
// through.
func TestARetireByAProcessThatLostItsWorkerIDLeavesTheNewHoldersRow(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	cc := pool.Config().ConnConfig
	l := ledger.New(pool, 30*time.Second)
	old, err := ledger.TryWorkerLock(ctx, cc, "wr", 30*time.Second, ledger.WorkerLockHooks{})
	if err != nil {
		t.Fatal(err)
	}
	oldPID := old.HolderPID()
	if oldPID == 0 || int64(oldPID) != lockBackend(t, pool, "wr") {
		t.Fatalf("HolderPID %d, want the lock's backend %d", oldPID, lockBackend(t, pool, "wr"))
	}
	old.Release() // the id lost: its session ended
	now, err := ledger.TryWorkerLock(ctx, cc, "wr", 30*time.Second, ledger.WorkerLockHooks{})
	if err != nil {
		t.Fatal(err)
	}
	defer now.Release()
	if _, err := l.RegisterWorker(ctx, "wr", []string{"a"}, now.HolderPID()); err != nil {
		t.Fatal(err)
	}
	// the old process's heartbeat writes nothing into the new holder's row
	if _, err := l.RegisterWorker(ctx, "wr", []string{"b"}, oldPID); !errors.Is(err, ledger.ErrWorkerIDNotHeld) {
		t.Fatalf("a heartbeat without the worker id: %v, want ErrWorkerIDNotHeld", err)
	}
	if count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = 'wr' AND partners = ARRAY['a']`) != 1 {
		t.Fatal("a process that lost the worker id wrote its partners into the new holder's row")
	}
	live := `SELECT count(*) FROM intake_worker WHERE worker_id = 'wr' AND drained_at IS NULL AND last_seen > now() - interval '10 seconds'`
	if err := l.RetireWorker(ctx, "wr", true, oldPID); err != nil {
		t.Fatal(err)
	}
	if count(t, pool, live) != 1 {
		t.Fatal("a process that lost the worker id retired the row of the id's new holder")
	}
	if err := l.RetireWorker(ctx, "wr", true, now.HolderPID()); err != nil {
		t.Fatal(err)
	}
	if count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = 'wr' AND drained_at IS NOT NULL`) != 1 {
		t.Fatal("the holder's retire did not retire the row")
	}
}
