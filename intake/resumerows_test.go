package intake_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A claim whose row was never recorded (the rename's reply lost, the
// process stopped) is recorded by the next start's first poll and run by
// that same poll: the look-up of the worker's due rows begun beside the
// poll's dial is not taken as the answer once the housekeeping recorded a
// claim (resumeRows).
func TestAClaimRecordedByTheHousekeepingRunsInThatPoll(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "hk")
	site.Drop(t, "orders-h.csv", goodRows("H", 3))
	first := newRig(t, pool, "w1", site)
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := first.d.PollOnce(ctx, "hk"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected loss after the claim's rename", err)
	}
	fault.Set("")
	first.d.Stop()
	if got := site.Files(t, "processing"); len(got) != 1 || len(files(t, pool, "hk")) != 0 {
		t.Fatalf("processing/ holds %v with %d rows, want the claimed file without a row", got, len(files(t, pool, "hk")))
	}

	second := newRig(t, pool, "w1", site) // the same worker id, started again
	second.poll("hk")
	fs := files(t, pool, "hk")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("after the restart's first poll: %+v, want the claim recorded and archived by it", fs)
	}
	testenv.AssertExactOrders(t, pool, "hk", 3, "H")
}

// aFileToResume is partner acme's site (its config changed by tune, when
// given) with its first file archived and its second left to this
// worker's next poll in its processing dir: that file's poll stopped in
// its chunk.
func aFileToResume(t *testing.T, tune func(*partners.Config)) (*rig, *pgxpool.Pool, *testenv.Site) {
	t.Helper()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	if tune != nil {
		tune(&site.Config)
	}
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 5, Base: time.Millisecond, Max: time.Millisecond}}, site)
	site.Drop(t, "orders-1.csv", goodRows("L", 3))
	r.poll("acme")
	site.Drop(t, "orders-2.csv", strings.ReplaceAll(goodRows("L", 3), ",paid,", ",shipped,"))
	if err := fault.Set("apply:mid_chunk=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(context.Background(), "acme"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected stop in the chunk", err)
	}
	fault.Set("")
	waitDue(t, pool, "acme")
	return r, pool, site
}

// A resumed file takes one of the partner's slots, not its poll: while its
// rows wait behind a lock the application holds on the target (a chunk's
// statement may wait 30 minutes, and a file tries five times), the
// partner's new files are claimed and archived beside it. Ready/ is listed
// beside the housekeeping, and the claims start once the resumed files
// have their slots.
func TestAResumedFileWaitingOnTheTargetHoldsUpNoNewClaim(t *testing.T) {
	ctx := context.Background()
	r, pool, site := aFileToResume(t, nil)

	// the application holds the rows the resumed file writes
	app := appHoldsRows(t, pool, "acme")
	site.Drop(t, "orders-3.csv", goodRows("N", 2))
	done := make(chan error, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		done <- r.d.PollOnce(pctx, "acme")
	}()
	waitFor(t, "the new file archived beside the resumed one waiting on its rows", func() bool {
		fs := files(t, pool, "acme")
		if len(fs) == 3 && fs[2].State == "archived" {
			if fs[1].State == "archived" {
				t.Fatalf("%+v: the resumed file was archived while the application held its rows", fs[1])
			}
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("the poll ended (%v) with %+v, want the new file archived while the resumed one waits", err, fs)
		default:
		}
		return false
	})
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "acme")
	if fs[1].State != "archived" || fs[1].Applied != 3 || fs[2].Applied != 2 {
		t.Fatalf("%+v, want both archived once the lock is gone", fs)
	}
}

// An entry of ready/ that can never be processed is one of the partner's
// files in flight while it moves to quarantine/: at concurrency 1 it waits
// for the slot a resumed file holds (its rows behind the application's
// lock), and moves once that file is done. Before, it moved beside the
// resumed file: concurrency + 1 of the partner's files at once.
func TestAHostileEntryTakesOneOfThePartnersSlots(t *testing.T) {
	ctx := context.Background()
	r, pool, site := aFileToResume(t, concurrencyOne)

	app := appHoldsRows(t, pool, "acme")
	site.Drop(t, "invoice.pdf", "%PDF") // no feed's name
	slotWait := &intake.Signals(r.d).SlotWait
	slotWait.Init(t)
	done := make(chan error, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		done <- r.d.PollOnce(pctx, "acme")
	}()
	waitFor(t, "the resumed file's chunk waiting on the application's lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND backend_type = 'client backend'`) > 0
	})
	// the entry's move waits for the slot the resumed file holds
	slotWait.WaitOrTimeout()
	if fs := files(t, pool, "acme"); len(fs) != 2 || !slices.Contains(site.Files(t, "ready"), "invoice.pdf") {
		t.Fatalf("%+v, ready/ %v: the hostile entry moved while the resumed file held the partner's one slot", fs, site.Files(t, "ready"))
	}
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[1].State != "archived" || fs[2].State != "quarantined" || fs[2].Reason != "no_feed" {
		t.Fatalf("%+v, want the resumed file archived and the entry held no_feed after it", fs)
	}
}

func concurrencyOne(c *partners.Config) { c.Concurrency = 1 }

// A drain starts nothing more: a poll whose claim waits for the partner's
// one slot (a resumed file holds it, its rows behind the application's
// lock) when Stop begins does not claim once the slot frees. The resumed
// file finishes within the drain time; the new file stays in ready/.
func TestADrainClaimsNothingAfterTheSlotFrees(t *testing.T) {
	ctx := context.Background()
	r, pool, site := aFileToResume(t, func(c *partners.Config) {
		concurrencyOne(c)
		c.Poll = "@every 1s"
	})
	app := appHoldsRows(t, pool, "acme")
	site.Drop(t, "orders-3.csv", goodRows("N", 2))
	slotWait, draining := &intake.Signals(r.d).SlotWait, &intake.Signals(r.d).Draining
	slotWait.Init(t)
	draining.Init(t)
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resumed file's chunk waiting on the application's lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND backend_type = 'client backend'`) > 0
	})
	slotWait.WaitOrTimeout() // the claim of orders-3.csv waits for the slot
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		r.d.Stop()
	}()
	draining.WaitOrTimeout() // Stop ends the claims first of all
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return within a minute")
	}
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" || !slices.Contains(site.Files(t, "ready"), "orders-3.csv") {
		t.Fatalf("%+v, ready/ %v: want the resumed file archived in the drain and orders-3.csv left in ready/", fs, site.Files(t, "ready"))
	}
}
