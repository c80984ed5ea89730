package intake_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/pgtemp"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// Row 8: PostgreSQL stops in the middle of an apply and comes back. Chunks
// in flight roll back and are retried; the ledger keeps committed ones from
// being applied twice.
// PostgreSQL goes down in the middle of a file's chunks and comes back.
// A fast shutdown flushes everything committed; an immediate one (a crash)
// may lose the last chunks committed without waiting for the WAL flush:
// the ledger then lags what the worker saw commit, and the file resumes
// from the ledger. Either way every row lands exactly once.
func TestPostgresRestartDuringApply(t *testing.T) {
	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) { testPostgresRestartDuringApply(t, mode) })
	}
}

func testPostgresRestartDuringApply(t *testing.T, mode string) {
	pg, err := pgtemp.Start(pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	ctx := context.Background()
	url, err := pg.CreateDB(ctx, "outage")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	// the operator's table, created on a session of the default path (on
	// the daemon's, pg_catalog first, an unqualified CREATE is refused)
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, testenv.TargetDDL)
	c.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pc, _ := intake.PoolConfig(url, "w1", 30*time.Second)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	site := testenv.NewSite(t, "pgdown")
	site.Config.Feeds[0].ChunkRows = 100
	const rows = 40000
	site.Drop(t, "orders-big.csv", testenv.OrdersCSV("B", rows))
	r := newRig(t, pool, "w1", site)
	retried := &intake.Signals(r.d).ChunkRetry
	retried.Init(t)

	// due: every file not yet archived may be attempted now (the ledger's
	// next_attempt_at, on the database's clock); an error is "not yet"
	due := func() bool {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT coalesce(bool_and(next_attempt_at IS NULL OR next_attempt_at <= pg_catalog.clock_timestamp()), true)
			FROM file_intake WHERE partner_id = 'pgdown' AND state <> 'archived'`).Scan(&ok)
		return err == nil && ok
	}
	var wg sync.WaitGroup
	var errs []error
	failed := make(chan struct{}, 1)
	restarted, finished := make(chan struct{}), make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(finished)
		for i := 0; i < 200; i++ { // the daemon's loop polls again after a failure
			err := r.d.PollOnce(ctx, "pgdown")
			if err == nil {
				var done bool // an error (the database still down) is "not yet"
				pool.QueryRow(ctx, `SELECT bool_and(state = 'archived') FROM file_intake WHERE partner_id = 'pgdown'`).Scan(&done)
				if done {
					return
				}
				// the file failed on its own (its retry backoff, the
				// partner's poll fine): the daemon's schedule polls again,
				// and the poll that takes the file up is one after its
				// next attempt is due (what this loop waits for)
				for !due() {
					select {
					case <-ctx.Done():
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
				continue
			}
			errs = append(errs, err)
			select {
			case failed <- struct{}{}:
			default:
			}
			<-restarted // the daemon's loop backs off; here: until PostgreSQL is back
		}
	}()
	waitUntil(t, func() bool {
		var n int64
		pool.QueryRow(ctx, `SELECT count(*) FROM intake_chunk`).Scan(&n)
		return n >= 5
	})
	if err := pg.StopServer(mode); err != nil {
		t.Fatal(err)
	}
	// the outage lasts until the apply meets it: a chunk retried or the poll failed
	select {
	case <-retried.C():
	case <-failed:
	case <-finished: // the file landed before the outage: said below
	case <-time.After(2 * time.Minute):
		t.Fatal("the outage never reached the apply")
	}
	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	close(restarted)
	wg.Wait()
	retries := testutil.ToFloat64(r.d.Metrics().ChunkRetries.WithLabelValues("pgdown"))
	t.Logf("during the outage: %v chunk retries, %d failed polls (%v)", retries, len(errs), errs)
	if retries == 0 && len(errs) == 0 {
		t.Fatal("the outage did not hit the apply")
	}
	fs := testenv.Files(t, pool, "pgdown")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != rows || fs[0].Chunks != rows/100 {
		t.Fatalf("got %+v, want archived with %d rows applied once in %d chunks", fs, rows, rows/100)
	}
	testenv.AssertExactOrders(t, pool, "pgdown", rows, "B")
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk`); n != rows/100 {
		t.Fatalf("ledger holds %d chunks", n)
	}
}

// The SFTP connection is cut in the middle of a download (a TCP proxy that
// drops it): the half-written spool file is never promoted, the file stays
// claimed, and the next poll downloads it again.
func TestConnectionCutMidDownload(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "cut")
	proxy := testenv.NewProxy(t, site.Config.SFTP.Address)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(kh, []byte(knownhosts.Line([]string{proxy.Addr()}, testenv.SSHD().HostKey)+"\n"), 0o600)
	site.Config.SFTP.Address, site.Config.SFTP.KnownHostsFile = proxy.Addr(), kh
	const rows = 8000 // about 400 KB
	site.Drop(t, "orders-cut.csv", testenv.OrdersCSV("C", rows))
	spoolDir := t.TempDir()
	sp, _ := spool.New(spoolDir)
	cfg := site.Validated(t)
	d, err := intake.New(intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1}, []partners.Config{cfg}, pool, sp, prometheus.NewRegistry(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	proxy.CutAfter(150 << 10)
	if err := d.PollOnce(context.Background(), "cut"); err == nil {
		t.Fatal("the poll survived a cut connection")
	}
	if proxy.Cuts() != 1 {
		t.Fatal("the connection was not cut")
	}
	if f := testenv.Files(t, pool, "cut")[0]; f.State != "claimed" {
		t.Fatalf("got %+v, want still claimed", f)
	}
	if tmps, _ := sp.TempFiles("cut", 0); len(tmps) != 0 {
		t.Fatalf("a half-written spool file is left: %v", tmps)
	}
	if err := d.PollOnce(context.Background(), "cut"); err != nil {
		t.Fatal(err)
	}
	if f := testenv.Files(t, pool, "cut")[0]; f.State != "archived" || f.Applied != rows {
		t.Fatalf("got %+v", f)
	}
	testenv.AssertExactOrders(t, pool, "cut", rows, "C")
}

// Row 18: one partner's site is down; the daemon backs off that partner
// alone and keeps serving the others.
func TestOnePartnerDownDoesNotBlockOthers(t *testing.T) {
	_, pool := testenv.DB(t)
	down := testenv.NewSite(t, "down")
	down.Config.SFTP.Address = "127.0.0.1:1" // nothing listens
	up := testenv.NewSite(t, "up")
	down.Config.Poll, up.Config.Poll = "@every 1s", "@every 1s"
	r := newRig(t, pool, "w1", down, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.d.Stop()
	up.Drop(t, "orders-up1.csv", testenv.OrdersCSV("U", 3))
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id='up' AND state='archived'`) == 1
	})
	up.Drop(t, "orders-up2.csv", testenv.OrdersCSV("V", 3))
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id='up' AND state='archived'`) == 2
	})
	m := r.d.Metrics()
	if testutil.ToFloat64(m.PollErrors.WithLabelValues("down")) < 1 || testutil.ToFloat64(m.PartnerUp.WithLabelValues("down")) != 0 {
		t.Fatal("the down partner's failures are not counted")
	}
	if testutil.ToFloat64(m.PartnerUp.WithLabelValues("up")) != 1 {
		t.Fatal("the healthy partner is not up")
	}
}

// Row 16: below the spool's free-space floor nothing is claimed; claiming
// resumes by itself when there is room.
func TestSpoolBackpressure(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "bp")
	site.Drop(t, "orders-bp.csv", testenv.OrdersCSV("P", 3))
	r := newRig(t, pool, "w1", site)
	intake.SetSpoolMinFree(r.d, 1<<62)
	r.poll("bp")
	if len(testenv.Files(t, pool, "bp")) != 0 || len(site.Files(t, "ready")) != 1 {
		t.Fatal("a file was claimed while the spool disk was below its floor")
	}
	if testutil.ToFloat64(r.d.Metrics().Backpressure) != 1 {
		t.Fatal("backpressure is not reported")
	}
	intake.SetSpoolMinFree(r.d, 1)
	r.poll("bp")
	if fs := testenv.Files(t, pool, "bp"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("got %+v", fs)
	}
	if testutil.ToFloat64(r.d.Metrics().Backpressure) != 0 {
		t.Fatal("backpressure still reported")
	}
}

// Row 11: the archive name is taken (someone put a file there): the file
// is archived under a new unique name; nothing is overwritten.
func TestArchiveNeverOverwrites(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "arch")
	content := testenv.OrdersCSV("A", 3)
	site.Drop(t, "orders-a.csv", content)
	now := time.Now().UTC()
	dir := filepath.Join(site.Root, "archive", now.Format("2006"), now.Format("01"))
	os.MkdirAll(dir, 0o755)
	squatter := filepath.Join(dir, "orders-a."+sha(content)[:12]+".1.csv") // intake id 1 in a fresh database
	os.WriteFile(squatter, []byte("someone else's"), 0o644)
	r := newRig(t, pool, "w1", site)
	r.poll("arch")
	f := testenv.Files(t, pool, "arch")[0]
	if f.State != "archived" || filepath.Base(f.Archive) != "orders-a."+sha(content)[:12]+".1.1.csv" {
		t.Fatalf("got %+v, want archived under the next free name", f)
	}
	if b, _ := os.ReadFile(squatter); string(b) != "someone else's" {
		t.Fatal("the existing archive file was overwritten")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, cond)
}
