package intake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
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
// cut connection) publishes nothing until it holds the id again: another
// process of the id may have taken its files over at once. Before, a
// step whose fence had passed went on; a group's fence stood for a third
// of a lease.
func TestAProcessThatLostItsWorkerIDPublishesNothing(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "wlost")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("L", 4))
	resume := r.pollPaused("wlost", "publish:archive")
	endWorkerLockSession(t, pool, "w1")
	waitFor(t, "the process to see its worker id lost", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 0 })
	err := resume()
	var fe *intake.FencedError
	if !errors.As(err, &fe) && err != nil {
		t.Fatalf("poll after the loss: %v", err)
	}
	f := files(t, pool, "wlost")[0]
	if f.State != "applied" || f.Archive != "" {
		t.Fatalf("%+v, want applied and not archived: a process without its worker id publishes nothing", f)
	}
	if ents, _ := os.ReadDir(filepath.Join(site.Root, "processing", "w1")); len(ents) != 1 {
		t.Fatalf("processing/w1 holds %d files, want the claimed file still there", len(ents))
	}
	// no other process took the id: the lock is taken again, and the
	// file ends on the next poll
	waitFor(t, "the worker id held again", func() bool { return testutil.ToFloat64(r.d.Metrics().WorkerIDHeld) == 1 })
	r.poll("wlost")
	if f := files(t, pool, "wlost")[0]; f.State != "archived" || f.Applied != 4 {
		t.Fatalf("%+v, want archived once the id is held again", f)
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
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", goodRows("A", 2))
	time.Sleep(3 * time.Second) // three of the partner's polls
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
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended('partner-intake/worker/' || $1, 0)`, worker).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != 1 {
		t.Fatalf("ended %d sessions holding worker %s's lock, want 1", ended, worker)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
