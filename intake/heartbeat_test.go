package intake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Long chunks may hold every connection of the work pool for longer than
// a lease. The replica's heartbeat and its files' lease renewals never
// wait behind them: otherwise the replica would look gone and its files'
// leases expire while it works, and another replica would take its live
// work over (ledger.Ledger.TakeOver ends a stalled owner's sessions).
func TestHeartbeatsDoNotWaitBehindAFullWorkPool(t *testing.T) {
	url, pool := testenv.DB(t)
	const lease = 3 * time.Second
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	work, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer work.Close()
	site := testenv.NewSite(t, "acme")
	r := newRigCfg(t, work, intake.Config{WorkerID: "w1", Lease: lease, SpoolMinFree: 1}, site)
	intake.Signals(r.d).WorkerBeat.Init(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.d.Stop()

	// a live row of w1, as a claim leaves it
	l := ledger.New(work, lease)
	in := &ledger.Intake{Partner: "acme", Feed: "orders", RemoteName: "orders-20261101.csv",
		ClaimedPath: "processing/w1/orders-20261101.csv", Worker: "w1"}
	if err := l.InsertClaim(ctx, in); err != nil {
		t.Fatal(err)
	}

	// every connection of the work pool held, as by long chunks; the
	// daemon's own poll may hold one already, so take what is free
	var held []*pgxpool.Conn
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	for len(held) < int(pc.MaxConns) {
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := work.Acquire(actx)
		acancel()
		if err != nil {
			t.Fatalf("hold the work pool: %v", err)
		}
		held = append(held, c)
	}

	// the file's lease is renewed on the daemon's heartbeat connections
	beat := intake.BeatLedger(r.d)
	for i := 0; i < 2; i++ {
		hctx, hcancel := context.WithTimeout(ctx, lease)
		err := beat.Heartbeat(hctx, in, nil)
		if err == nil {
			var held map[int64]bool
			held, err = beat.Renew(hctx, []*ledger.Intake{in}, nil)
			if err == nil && !held[in.ID] {
				err = fmt.Errorf("file %d not held after a group's renewal", in.ID)
			}
		}
		hcancel()
		if err != nil {
			t.Fatalf("renew a file's lease while the work pool is full: %v", err)
		}
	}

	// and the replica's heartbeat goes on recording it alive: three beats
	// (a lease's worth) while the work pool stays full
	beats := &intake.Signals(r.d).WorkerBeat
	beats.Clear()
	for range 3 {
		beats.WaitOrTimeout()
	}
	var fresh bool
	if err := pool.QueryRow(ctx, `SELECT last_seen > now() - lease FROM intake_worker WHERE worker_id = 'w1'`).Scan(&fresh); err != nil {
		t.Fatal(err)
	}
	if !fresh {
		t.Fatal("the replica's heartbeat went stale while long chunks held the work pool")
	}
}
