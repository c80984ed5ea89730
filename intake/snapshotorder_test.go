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

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Snapshots apply in claim order: S1 {1..6} is applied; S2 {1,2} waits
// for approval (its plan would delete most of the table); S3 {1..6} is
// applied at once. Approving S2 afterwards with the hash shown before S3
// must not move the table back to S2's two rows: S2 is older than the
// newest applied snapshot, so it ends superseded, its receipt naming S3.
func TestAnOlderSnapshotNeverUndoesANewerOne(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "so")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("S", 6))
	r.poll("so")
	site.Drop(t, "orders-2.csv", goodRows("S", 2))
	r.poll("so")
	fs := files(t, pool, "so")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "awaiting_approval" {
		t.Fatalf("rows %+v, want S1 archived and S2 waiting", fs)
	}
	s2 := fs[1]
	v2, _ := planOf(t, pool, "so", s2.ID)
	site.Drop(t, "orders-3.csv", goodRows("S", 6))
	r.poll("so")
	if f := files(t, pool, "so")[2]; f.State != "archived" {
		t.Fatalf("S3 %+v, want it applied at once", f)
	}
	s3 := files(t, pool, "so")[2]
	// the approval of the hash shown is refused (the CLI names the
	// configured snapshot feeds); approved without that, S2 still never
	// applies
	err := ops.Approve(ctx, pool, ledger.PlanDecision{IntakeID: s2.ID, Partners: []string{"so"}, Actor: "alice", Reason: "reviewed",
		PlanHash: v2.Hash, SnapshotFeeds: []string{"so/orders"}})
	if !errors.Is(err, ledger.ErrPlanDecision) || !strings.Contains(err.Error(), "older than one its feed has applied") {
		t.Fatalf("approving the older snapshot: %v, want it refused", err)
	}
	if err := approve(ctx, pool, "so", s2.ID, v2.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("so")
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'so'`); n != 6 {
		t.Fatalf("target holds %d rows after S2 was approved, want S3's 6", n)
	}
	f := files(t, pool, "so")[1]
	if f.State != "archived" || f.Reason != "superseded" || f.Applied != 0 {
		t.Fatalf("S2 ends %+v, want archived as superseded, nothing applied", f)
	}
	rc := receiptOf(t, site, f)
	if rc.Outcome != ledger.OutcomeSuperseded || rc.SupersededBy != s3.ID {
		t.Fatalf("S2's receipt %+v, want outcome superseded naming intake %d", rc, s3.ID)
	}
}

// A snapshot's chunk holds its feed's snapshot lock to its commit, also
// after it rolls back to its savepoint: the chunk of a snapshot whose keys
// the target holds tries them straight in, is refused by the unique index
// and goes on through the merge. A lock taken inside the savepoint ended
// with that rollback, and a newer snapshot applied ahead meanwhile judged
// the rows as the target still held them: the older's values stayed.
func TestASnapshotChunkHoldsItsFeedsLockPastARollbackToItsSavepoint(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "sl")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("S", 6))
	r.poll("sl")
	site.Drop(t, "orders-2.csv", strings.ReplaceAll(goodRows("S", 6), ",paid,", ",shipped,"))
	resume := r.pollPaused("sl", "apply:mid_chunk")
	var free bool // a statement's own transaction: a lock it gets ends with it
	err := pool.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('partner-intake/snapshot/sl/' || $1::text, 0))`,
		site.Config.Feeds[0].Name).Scan(&free)
	if err != nil {
		t.Fatal(err)
	}
	if free {
		t.Errorf("the feed's snapshot lock was free while a chunk of its snapshot was being written")
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if f := files(t, pool, "sl")[1]; f.State != "archived" || f.Applied != 6 {
		t.Fatalf("the second snapshot ends %+v, want archived with its 6 rows applied", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sl' AND status = 'shipped'`); n != 6 {
		t.Fatalf("%d rows hold the second snapshot's values, want 6", n)
	}
}

// Replaying a snapshot older than one its feed applied since would bring
// back the keys the newer one deleted: it is refused, unless forced with
// --force-older, which is audited and applies it.
func TestReplayOfAnOlderSnapshotIsRefusedUnlessForced(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "sr")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("R", 6))
	r.poll("sr")
	site.Drop(t, "orders-2.csv", goodRows("R", 5))
	r.poll("sr")
	fs := files(t, pool, "sr")
	if len(fs) != 2 || fs[1].State != "archived" {
		t.Fatalf("rows %+v, want both snapshots applied", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sr'`); n != 5 {
		t.Fatalf("target holds %d rows, want the second snapshot's 5", n)
	}
	_, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: fs[0].ID, Actor: "test", Reason: "re-apply"})
	if !errors.Is(err, ledger.ErrDecision) || !strings.Contains(err.Error(), "--force-older") {
		t.Fatalf("replay of the older snapshot: %v, want it refused", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sr'`); n != 5 {
		t.Fatalf("a refused replay changed the target: %d rows", n)
	}
	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: fs[0].ID, Actor: "test", Reason: "the newer file was wrong", ForceOlder: true})
	if err != nil || in.State != "archived" {
		t.Fatalf("forced replay: %+v, %v", in, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sr'`); n != 6 {
		t.Fatalf("target holds %d rows after the forced replay, want the older snapshot's 6", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1 AND action = 'replay' AND detail LIKE '%force_older%'`, in.ID); n != 1 {
		t.Fatal("the forced replay is not audited as such")
	}
}

// Four snapshots of one feed delivered together to a daemon that works on
// four of the partner's files at once: they never apply side by side, and
// an older one never commits after a newer one began. Each snapshot has a
// key set of its own and values of its own, so every row the newest
// writes carries its id: in the end the table is exactly the newest
// snapshot, every row written by it, and each older snapshot was either
// applied before it or archived as superseded.
func TestSnapshotsDeliveredTogetherApplyInOrderUnderConcurrency(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "sc")
	site.Config.Concurrency = 4
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true}
	site.Config.Feeds[0].ChunkRows = 200
	r := newRig(t, pool, "w1", site)
	const n = 1500
	for s := 1; s <= 4; s++ {
		var b strings.Builder
		b.WriteString(testenv.OrdersHeader)
		for i := s * 100; i < s*100+n; i++ { // each snapshot shifts the key set
			b.WriteString(ordersLine("K", i, fmt.Sprintf("%d.%02d", s, i%100)))
		}
		site.Drop(t, fmt.Sprintf("orders-%d.csv", s), b.String())
		if err := os.Chtimes(filepath.Join(site.Root, "ready", fmt.Sprintf("orders-%d.csv", s)), time.Time{}, time.Now().Add(time.Duration(s-10)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	r.poll("sc")
	fs := files(t, pool, "sc")
	if len(fs) != 4 {
		t.Fatalf("files %+v", fs)
	}
	newest := fs[len(fs)-1]
	if newest.Name != "orders-4.csv" || newest.State != "archived" || newest.Reason != "" {
		t.Fatalf("the newest snapshot %+v, want orders-4.csv applied", newest)
	}
	for _, f := range fs[:3] {
		if f.State != "archived" {
			t.Fatalf("older snapshot %+v, want archived (applied before the newest, or superseded)", f)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sc'`); got != n {
		t.Fatalf("target holds %d rows, want the newest snapshot's %d", got, n)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sc' AND last_intake_id = $1
		AND order_id IN (SELECT 'K-' || i FROM generate_series(400, 400 + $2 - 1) i)`, newest.ID, n); got != n {
		t.Fatalf("%d rows are the newest snapshot's keys written by it, want %d", got, n)
	}
}
