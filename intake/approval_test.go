package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

func ratio(v float64) *float64 { return &v }

// planOf reads a file's stored plan.
func planOf(t *testing.T, pool *pgxpool.Pool, partner string, id int64) (*ledger.PlanView, target.PlanCounts) {
	t.Helper()
	v, _, err := ops.PlanPage(context.Background(), pool, id, []string{partner}, ledger.ChangeFilter{}, 0, 0, 0)
	if err != nil || v == nil {
		t.Fatalf("plan of %d: %v %v", id, v, err)
	}
	var c target.PlanCounts
	if err := json.Unmarshal(v.Counts, &c); err != nil {
		t.Fatal(err)
	}
	return v, c
}

func audits(t *testing.T, pool *pgxpool.Pool, id int64) []string {
	t.Helper()
	return testenv.Strings(t, pool, `SELECT actor || ':' || action || ':' || reason FROM intake_audit WHERE intake_id = $1 ORDER BY audit_id`, id)
}

// reconcileAs runs a reconciler of worker once over the site's partner.
func reconcileAs(t *testing.T, pool *pgxpool.Pool, worker string, site *testenv.Site) []ledger.Finding {
	t.Helper()
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{}, worker, 30*time.Second, pool, sp,
		[]partners.Config{site.Validated(t)}, prometheus.NewRegistry(), testenv.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Stop()
	fs, err := rec.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func approve(ctx context.Context, pool *pgxpool.Pool, partner string, id int64, hash string) error {
	return ops.Approve(ctx, pool, ledger.PlanDecision{IntakeID: id, Partners: []string{partner}, Actor: "alice", Reason: "reviewed", PlanHash: hash})
}

// A plan over the feed's threshold waits in awaiting_approval without a
// lease while the partner's other files go through; a wrong hash is
// refused; the right one applies the file on the next poll, once; every
// decision is audited; under the threshold a file applies at once.
func TestPlanOverThresholdWaitsAndApprovedPlanApplies(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "ap")
	site.Config.Feeds[0].Approval = &partners.Approval{MaxUpdateRatio: ratio(0.5)}
	r := newRig(t, pool, "w1", site)

	site.Drop(t, "orders-1.csv", goodRows("A", 4))
	r.poll("ap")
	f1 := files(t, pool, "ap")[0]
	if f1.State != "archived" || f1.Applied != 4 {
		t.Fatalf("first file %+v: 4 creates are under the threshold and apply at once", f1)
	}
	if _, c := planOf(t, pool, "ap", f1.ID); c.Creates != 4 || c.Updates != 0 {
		t.Fatalf("first plan %+v, want 4 creates", c)
	}

	// 3 of 4 rows change: over max_update_ratio 0.5
	site.Drop(t, "orders-2.csv", header+ordersLine("A", 1, "99.00")+ordersLine("A", 2, "98.00")+ordersLine("A", 3, "97.00")+ordersLine("A", 4, ""))
	site.Drop(t, "orders-3.csv", goodRows("B", 2))
	older := time.Now().Add(-time.Minute) // claim order: orders-2 first
	if err := os.Chtimes(filepath.Join(site.Root, "ready", "orders-2.csv"), older, older); err != nil {
		t.Fatal(err)
	}
	r.poll("ap")
	fs := files(t, pool, "ap")
	f2, f3 := fs[1], fs[2]
	if f2.State != "awaiting_approval" || f2.Reason != "awaiting_approval" {
		t.Fatalf("second file %+v, want awaiting_approval", f2)
	}
	if f3.State != "archived" || f3.Applied != 2 {
		t.Fatalf("third file %+v: a waiting file must not block the partner's next file", f3)
	}
	if a, _ := amountOf(t, pool, "orders", "ap", "A-1"); a != "10.01" {
		t.Fatalf("A-1 = %s: a waiting plan wrote the target", a)
	}
	v, c := planOf(t, pool, "ap", f2.ID)
	if c.Updates != 3 || c.Unchanged != 1 || c.Creates != 0 || v.Hash == "" {
		t.Fatalf("plan %+v %+v, want 3 updates, 1 unchanged and a hash", c, v)
	}
	// every change of the plan, by line, with the columns it changes
	if got := changesOf(t, pool, f2.ID); got != "2 update (A-1) amount 10.01>99.00|3 update (A-2) amount 20.02>98.00|4 update (A-3) amount 30.03>97.00" {
		t.Fatalf("plan changes %q", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_plan_change_column WHERE intake_id = $1 AND col = 'amount'`, f2.ID); n != 3 {
		t.Fatalf("%d changes of amount indexed, want 3", n)
	}
	// no lease: the reconciler's expired-lease list never holds it, and
	// the file stays claimed in processing/
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE intake_id = $1 AND state = ANY('{claimed,spooled,applying,applied,outcome_unknown}')`, f2.ID); n != 0 {
		t.Fatal("the waiting file is in a live state")
	}
	if got := site.Files(t, "processing"); len(got) != 1 || !strings.HasSuffix(got[0], "orders-2.csv") {
		t.Fatalf("processing/ holds %v, want the waiting file", got)
	}
	if err := r.d.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Awaiting.WithLabelValues("ap")); got != 1 {
		t.Fatalf("intake_files_awaiting_approval = %v, want 1", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_outbox WHERE event = 'awaiting_approval' AND (payload->>'intake_id')::bigint = $1
		AND payload->>'plan_hash' = $2 AND payload->>'state' = 'awaiting_approval'`, f2.ID, v.Hash); n != 1 {
		t.Fatalf("%d awaiting_approval events, want 1", n)
	}
	// another replica's reconciler, even once the old lease is long past,
	// neither takes the waiting file over nor adopts it as an orphan
	execArgs(t, pool, `UPDATE file_intake SET lease_until = now() - interval '1 hour' WHERE intake_id = $1`, f2.ID)
	for _, fd := range reconcileAs(t, pool, "w2", site) {
		if fd.IntakeID == f2.ID || fd.Kind == ledger.KindOrphanClaim {
			t.Fatalf("the reconciler acted on the waiting file: %+v", fd)
		}
	}
	if got := site.Files(t, "processing"); len(got) != 1 || got[0] != "w1/orders-2.csv" {
		t.Fatalf("processing/ holds %v after the reconciler ran", got)
	}
	// a poll while it waits leaves it waiting, and so does another
	// replica's poll
	r.poll("ap")
	newRig(t, pool, "w3", site).poll("ap")
	if f := files(t, pool, "ap")[1]; f.State != "awaiting_approval" {
		t.Fatalf("after another poll %+v", f)
	}

	err := approve(ctx, pool, "ap", f2.ID, strings.Repeat("0", 64))
	if !errors.Is(err, ledger.ErrPlanDecision) || !strings.Contains(err.Error(), "is not the current plan") {
		t.Fatalf("approve with a wrong hash: %v", err)
	}
	if err := approve(ctx, pool, "other", f2.ID, v.Hash); !errors.Is(err, ledger.ErrPlanDecision) {
		t.Fatalf("approve from another partner's scope: %v", err)
	}
	if err := approve(ctx, pool, "ap", f2.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	if err := approve(ctx, pool, "ap", f2.ID, v.Hash); !errors.Is(err, ledger.ErrPlanDecision) || !strings.Contains(err.Error(), "not awaiting approval") {
		t.Fatalf("a second approve: %v", err)
	}
	r.poll("ap")
	f2 = files(t, pool, "ap")[1]
	if f2.State != "archived" || f2.Applied != 3 || f2.Unchanged != 1 {
		t.Fatalf("approved file %+v, want archived with 3 applied, 1 unchanged", f2)
	}
	if a, last := amountOf(t, pool, "orders", "ap", "A-1"); a != "99.00" || last != f2.ID {
		t.Fatalf("A-1 = %s by %d after approval", a, last)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Plans.WithLabelValues("ap", "approved_applied")); got != 1 {
		t.Fatalf("intake_plans_total{approved_applied} = %v", got)
	}
	if got := audits(t, pool, f2.ID); strings.Join(got, ",") != "intake:await_approval:awaiting_approval,alice:approve:reviewed" {
		t.Fatalf("audit %v", got)
	}
	if got := changesOf(t, pool, f2.ID); got != "" {
		t.Fatalf("the plan's changes outlived its apply: %q", got)
	}
	if err := r.d.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Awaiting.WithLabelValues("ap")); got != 0 {
		t.Fatalf("intake_files_awaiting_approval = %v after the decision", got)
	}
}

// The target changes between the plan and its approval: the approved
// file is planned again before apply, finds other counts, and waits again
// with the new plan (audited replan, plan_changed); the old hash is then
// refused and the new one applies. `always` makes every file wait.
func TestStaleApprovalReplansAndOldHashIsRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "st")
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("S", 3))
	r.poll("st")
	f1 := files(t, pool, "st")[0]
	if f1.State != "awaiting_approval" {
		t.Fatalf("first file %+v: policy always", f1)
	}
	v1, c1 := planOf(t, pool, "st", f1.ID)
	if c1.Creates != 3 {
		t.Fatalf("plan %+v", c1)
	}
	if err := approve(ctx, pool, "st", f1.ID, v1.Hash); err != nil {
		t.Fatal(err)
	}
	// another session writes one of the file's keys before the daemon
	// gets to the approved file
	exec(t, pool, `INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('st', 'S-2', 1, 'new', now(), 0)`)
	r.poll("st")
	f1 = files(t, pool, "st")[0]
	if f1.State != "awaiting_approval" || f1.Reason != "plan_changed" {
		t.Fatalf("file %+v, want back in awaiting_approval (plan_changed)", f1)
	}
	v2, c2 := planOf(t, pool, "st", f1.ID)
	if c2.Creates != 2 || c2.Updates != 1 || v2.Hash == v1.Hash || v2.ApprovedHash != v1.Hash {
		t.Fatalf("new plan %+v (hash %s, approved %s)", c2, v2.Hash, v2.ApprovedHash)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'st' AND last_intake_id = $1`, f1.ID); n != 0 {
		t.Fatalf("%d rows written under a plan nobody approved", n)
	}
	if err := approve(ctx, pool, "st", f1.ID, v1.Hash); !errors.Is(err, ledger.ErrPlanDecision) {
		t.Fatalf("the stale hash was not refused: %v", err)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Plans.WithLabelValues("st", "replanned")); got != 1 {
		t.Fatalf("intake_plans_total{replanned} = %v", got)
	}
	if err := approve(ctx, pool, "st", f1.ID, v2.Hash); err != nil {
		t.Fatal(err)
	}
	// the owner is gone: the replica that polls the partner takes the
	// approved file over (its lease expired with the decision) and
	// applies it, from its own spool
	r.d.Stop()
	r2 := newRig(t, pool, "w2", site)
	r2.poll("st")
	f1 = files(t, pool, "st")[0]
	if f1.State != "archived" || f1.Applied != 3 || f1.Worker != "w2" {
		t.Fatalf("file %+v after the second approval, want archived by w2", f1)
	}
	want := "intake:await_approval:awaiting_approval,alice:approve:reviewed,intake:replan:plan_changed,alice:approve:reviewed"
	if got := audits(t, pool, f1.ID); strings.Join(got, ",") != want {
		t.Fatalf("audit %v", got)
	}
}

// reject quarantines the file (plan_rejected) with a receipt saying so;
// of an approve and a reject racing on one waiting file exactly one wins.
func TestRejectQuarantinesAndDecisionsRaceToOneWinner(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "rj")
	site.Config.Feeds[0].Approval = &partners.Approval{MaxRows: func() *int64 { n := int64(1); return &n }()}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("R", 3))
	r.poll("rj")
	f1 := files(t, pool, "rj")[0]
	if f1.State != "awaiting_approval" {
		t.Fatalf("file %+v: 3 rows > max_rows 1", f1)
	}
	// a reject names the plan its reviewer saw: another one is refused
	// (the plan changed since), nothing decided
	err := ops.Reject(ctx, pool, ledger.PlanDecision{IntakeID: f1.ID, Partners: []string{"rj"}, Actor: "bob", Reason: "too big", PlanHash: "not-the-plan"})
	if !errors.Is(err, ledger.ErrPlanDecision) || !strings.Contains(err.Error(), "is not the current plan") {
		t.Fatalf("reject naming another plan: %v, want it refused", err)
	}
	if f := files(t, pool, "rj")[0]; f.State != "awaiting_approval" {
		t.Fatalf("file %+v after a refused reject, want it still waiting", f)
	}
	v, _ := planOf(t, pool, "rj", f1.ID)
	err = ops.Reject(ctx, pool, ledger.PlanDecision{IntakeID: f1.ID, Partners: []string{"rj"}, Actor: "bob", Reason: "too big", PlanHash: v.Hash})
	if err != nil {
		t.Fatal(err)
	}
	r.poll("rj")
	f1 = files(t, pool, "rj")[0]
	if f1.State != "quarantined" || f1.Reason != "plan_rejected" {
		t.Fatalf("rejected file %+v", f1)
	}
	if rc := receipt(t, site, f1.Receipt); rc.Outcome != ledger.OutcomeQuarantined || rc.Reason != reason.PlanRejected {
		t.Fatalf("receipt %+v", rc)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'rj'`); n != 0 {
		t.Fatalf("%d rows of a rejected plan landed", n)
	}
	if got := audits(t, pool, f1.ID); len(got) != 2 || got[1] != "bob:reject:too big" {
		t.Fatalf("audit %v", got)
	}
	// released from quarantine, it is planned again and waits again
	if err := ops.Release(ctx, pool, ops.Decision{IntakeID: f1.ID, Actor: "bob", Reason: "partner confirmed",
		Partners: []string{"rj"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	reconcileAs(t, pool, "w1", site)
	r.poll("rj")
	if f := files(t, pool, "rj")[0]; f.State != "awaiting_approval" || f.Reason != "awaiting_approval" {
		t.Fatalf("released rejected file %+v, want awaiting approval again", f)
	}
	if err := ops.Reject(ctx, pool, ledger.PlanDecision{IntakeID: f1.ID, Partners: []string{"rj"}, Actor: "bob", Reason: "still too big"}); err != nil {
		t.Fatal(err)
	}
	r.poll("rj")
	if f := files(t, pool, "rj")[0]; f.State != "quarantined" || f.Reason != "plan_rejected" {
		t.Fatalf("rejected again: %+v", f)
	}

	// a file under the threshold applies at once
	site.Drop(t, "orders-2.csv", goodRows("Q", 1))
	r.poll("rj")
	if f := files(t, pool, "rj")[1]; f.State != "archived" || f.Applied != 1 {
		t.Fatalf("one-row file %+v", f)
	}

	site.Drop(t, "orders-3.csv", goodRows("T", 2))
	r.poll("rj")
	f3 := files(t, pool, "rj")[2]
	v, _ = planOf(t, pool, "rj", f3.ID)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				errs[i] = approve(ctx, pool, "rj", f3.ID, v.Hash)
			} else {
				errs[i] = ops.Reject(ctx, pool, ledger.PlanDecision{IntakeID: f3.ID, Partners: []string{"rj"}, Actor: "carol", Reason: "race"})
			}
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ledger.ErrPlanDecision):
			t.Fatal(err)
		}
	}
	if won != 1 {
		t.Fatalf("%d decisions won, want exactly 1: %v", won, errs)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1 AND action IN ('approve', 'reject')`, f3.ID); n != 1 {
		t.Fatalf("%d decisions audited, want 1", n)
	}
}

// A snapshot that would delete more than max_delete_ratio of its rows
// waits; approved, it deletes exactly what its plan counted.
func TestSnapshotDeleteRatioWaits(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "sd")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].Approval = &partners.Approval{MaxDeleteRatio: ratio(0.5)}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("D", 6))
	r.poll("sd")
	if f := files(t, pool, "sd")[0]; f.State != "archived" {
		t.Fatalf("first snapshot %+v", f)
	}
	site.Drop(t, "orders-2.csv", header+ordersLine("D", 1, "")+ordersLine("D", 2, ""))
	r.poll("sd")
	f2 := files(t, pool, "sd")[1]
	v, c := planOf(t, pool, "sd", f2.ID)
	if f2.State != "awaiting_approval" || c.Deletes != 4 || c.Unchanged != 2 {
		t.Fatalf("snapshot %+v plan %+v: 4 deletes of 2 rows is over 0.5", f2, c)
	}
	// the file's rows change nothing; its deletes follow its last line,
	// in key order
	if got := changesOf(t, pool, f2.ID); got != "4 delete (D-3)|5 delete (D-4)|6 delete (D-5)|7 delete (D-6)" {
		t.Fatalf("plan changes %q", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sd'`); n != 6 {
		t.Fatalf("the plan deleted rows: %d left", n)
	}
	if err := approve(ctx, pool, "sd", f2.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	if got := changesOf(t, pool, f2.ID); got != "" {
		t.Fatalf("the plan's changes outlived the decision: %q", got)
	}
	r.poll("sd")
	if f := files(t, pool, "sd")[1]; f.State != "archived" {
		t.Fatalf("approved snapshot %+v", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sd'`); n != 2 {
		t.Fatalf("%d rows after the approved snapshot, want 2", n)
	}
}

// A snapshot whose file repeats a key (a partner's export restarted part
// way repeats a block) is guarded and swept as its plan says, whether the
// repeat falls in one chunk or across two: the earlier line is rejected
// (duplicate_key) but its key is in the file, so the plan counts the
// deletes and the delete guard holds it. Before, the plan counted no
// deletes (a file with rejects sweeps nothing) while the apply, which
// rejects no repeat across chunks, swept: three rows deleted unguarded.
func TestASnapshotThatRepeatsAKeyIsGuardedAsItIsSwept(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		partner string
		lines   []int // of D-1..D-3, in file order; chunks of 3 rows
	}{
		{"across", []int{1, 2, 3, 1}}, // D-1 again in the second chunk
		{"within", []int{1, 1, 2, 3}}, // D-1 twice in the first
	} {
		site := testenv.NewSite(t, tc.partner)
		site.Config.Feeds[0].Mode = partners.ModeSnapshot
		site.Config.Feeds[0].ChunkRows = 3
		site.Config.Feeds[0].Approval = &partners.Approval{MaxDeleteRatio: ratio(0.4)}
		r := newRig(t, pool, "w-"+tc.partner, site)
		site.Drop(t, "orders-1.csv", goodRows("D", 6))
		r.poll(tc.partner)
		body := header
		for _, i := range tc.lines {
			body += ordersLine("D", i, "")
		}
		site.Drop(t, "orders-2.csv", body)
		r.poll(tc.partner)
		f2 := files(t, pool, tc.partner)[1]
		v, c := planOf(t, pool, tc.partner, f2.ID)
		if f2.State != "awaiting_approval" || c.Deletes != 3 || c.Duplicates != 1 {
			t.Fatalf("%s: snapshot %+v plan %+v: 3 deletes of 6 rows is over 0.4", tc.partner, f2, c)
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, tc.partner); n != 6 {
			t.Fatalf("%s: %d rows while the plan waits, want 6", tc.partner, n)
		}
		if err := approve(ctx, pool, tc.partner, f2.ID, v.Hash); err != nil {
			t.Fatal(err)
		}
		r.poll(tc.partner)
		if f := files(t, pool, tc.partner)[1]; f.State != "archived" {
			t.Fatalf("%s: approved snapshot %+v", tc.partner, f)
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, tc.partner); n != 3 {
			t.Fatalf("%s: %d rows after the approved snapshot, want D-1..D-3", tc.partner, n)
		}
		r.d.Stop()
	}
}

// The target changes after the approved file's plan step moved it to
// applying but before its first chunk: the first chunk plans it again in
// its own transaction, finds other counts, writes nothing and sends the
// file back to awaiting_approval (plan_changed, audited).
func TestTargetChangedBeforeTheFirstChunkReplans(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	_, r, f, v1 := approvedFile(t, pool, "fc", "F")
	resume := r.pollPaused("fc", "approval:before_first_chunk")
	if st := files(t, pool, "fc")[0].State; st != "applying" {
		t.Fatalf("state %s at the first chunk, want applying", st)
	}
	exec(t, pool, `INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('fc', 'F-3', 1, 'new', now(), 0)`)
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	f = files(t, pool, "fc")[0]
	if f.State != "awaiting_approval" || f.Reason != "plan_changed" || f.Chunks != 0 {
		t.Fatalf("file %+v, want back in awaiting_approval with no chunk applied", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'fc' AND last_intake_id = $1`, f.ID); n != 0 {
		t.Fatalf("%d rows written under a plan nobody approved", n)
	}
	v2, c2 := planOf(t, pool, "fc", f.ID)
	if v2.Hash == v1.Hash || c2.Creates != 2 || c2.Updates != 1 {
		t.Fatalf("new plan %+v", c2)
	}
	// the plan that waits again is stored with its changes
	if got := changesOf(t, pool, f.ID); !strings.HasPrefix(got, "2 create (F-1)|3 create (F-2)|4 update (F-3) amount 1.00>30.03 ") {
		t.Fatalf("plan changes %q", got)
	}
	if got := audits(t, pool, f.ID); len(got) != 3 || got[2] != "intake:replan:plan_changed" {
		t.Fatalf("audit %v", got)
	}
	if err := approve(ctx, pool, "fc", f.ID, v2.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("fc")
	if f := files(t, pool, "fc")[0]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("file %+v after the second approval", f)
	}
}

// A target whose rows travel as COPY text (a double precision column, no
// intake_row_hash) is planned the same way: the staged text is cast by the
// merge's own expressions. Also an update_only feed's missing keys and an
// insert_only feed's existing keys are counted as the merge would judge
// them.
func TestPlanOnATextTargetAndPerMode(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	ordersFloat(t, pool)
	for _, tc := range []struct {
		partner string
		mode    partners.Mode
		check   func(c target.PlanCounts) bool
	}{
		{"tx", partners.ModeUpsert, func(c target.PlanCounts) bool { return c.Updates == 1 && c.Unchanged == 1 && c.Creates == 1 }},
		{"ux", partners.ModeUpdateOnly, func(c target.PlanCounts) bool { return c.Updates == 1 && c.Unchanged == 1 && c.NotFound == 1 }},
		{"ix", partners.ModeInsertOnly, func(c target.PlanCounts) bool { return c.Exists == 2 && c.Creates == 1 }},
	} {
		site := testenv.NewSite(t, tc.partner)
		site.Config.Feeds[0].Target = "orders_float"
		// a worker id of its own for each rig: the test is about plans,
		// not about one id's hold passing from a stopped rig to the next
		r := newRig(t, pool, "w1-"+tc.partner, site)
		site.Drop(t, "orders-1.csv", goodRows("X", 2))
		r.poll(tc.partner)
		r.d.Stop()
		site.Config.Feeds[0].Mode = tc.mode
		site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
		r = newRig(t, pool, "w2-"+tc.partner, site)
		site.Drop(t, "orders-2.csv", header+ordersLine("X", 1, "7.25")+ordersLine("X", 2, "")+ordersLine("X", 3, ""))
		r.poll(tc.partner)
		f := files(t, pool, tc.partner)[1]
		v, c := planOf(t, pool, tc.partner, f.ID)
		if f.State != "awaiting_approval" || !tc.check(c) {
			t.Fatalf("%s: file %+v plan %+v", tc.mode, f, c)
		}
		if err := approve(ctx, pool, tc.partner, f.ID, v.Hash); err != nil {
			t.Fatal(err)
		}
		r.poll(tc.partner)
		f = files(t, pool, tc.partner)[1]
		if f.State != "archived" || f.Applied != c.Creates+c.Updates || f.Confl != c.Conflicts() || f.Rejected != c.Rejects() {
			t.Fatalf("%s: applied %+v, plan said %+v", tc.mode, f, c)
		}
		r.d.Stop()
	}
}

// On a COPY text target a value the column's type refuses (40000 for a
// smallint) fails no plan: the plan counts the row as target_refused, as
// the apply then rejects it.
func TestPlanCountsValuesTheTargetTypeRefuses(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	exec(t, pool, `CREATE TABLE orders_small (
		partner_id text NOT NULL, order_id text NOT NULL, email text, amount double precision NOT NULL,
		status text NOT NULL, placed_at timestamptz NOT NULL, qty smallint, last_intake_id bigint NOT NULL,
		PRIMARY KEY (partner_id, order_id))`)
	site := testenv.NewSite(t, "tr")
	site.Config.Feeds[0].Target = "orders_small"
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("T", 3)+"T-9,c9@example.com,9.09,paid,2026-11-01T10:00:00Z,40000\n")
	r.poll("tr")
	f := files(t, pool, "tr")[0]
	v, c := planOf(t, pool, "tr", f.ID)
	if f.State != "awaiting_approval" || c.Creates != 3 || c.TargetRefused != 1 {
		t.Fatalf("file %+v plan %+v, want 3 creates and 1 target_refused", f, c)
	}
	if err := approve(ctx, pool, "tr", f.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("tr")
	f = files(t, pool, "tr")[0]
	if f.State != "archived" || f.Applied != 3 || f.Rejected != 1 {
		t.Fatalf("file %+v, want 3 applied and the refused row rejected", f)
	}
	if got := issues(t, pool, f.ID); len(got) != 1 || got[0] != "5:target_refused:rejected" {
		t.Fatalf("row issues %v", got)
	}
}

// An approved file whose daemon restarts under another configuration is
// held to its approved plan: the plan hash covers the feed's mapping, so
// a changed mapping (same counts) makes the fresh plan differ, and a
// policy gone from the configuration does not wave it through when the
// target changed; either way the file waits again (plan_changed) rather
// than apply under a plan nobody approved, and the new hash applies it.
func TestAnApprovedPlanIsHeldToItsHashAcrossARestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		partner string
		// restart changes the configuration (and the target) the next
		// rig runs under
		restart func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site)
		// replanned checks the fresh plan against the approved one
		replanned func(v1, v2 *ledger.PlanView, c1, c2 target.PlanCounts) bool
		// then runs after the file is archived
		then func(t *testing.T, r *rig, site *testenv.Site)
	}{
		{"the mapping changed", "mc",
			func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site) { site.Config.Feeds[0].ChunkRows = 7 },
			func(v1, v2 *ledger.PlanView, c1, c2 target.PlanCounts) bool {
				return c2 == c1 && v2.FeedSHA != v1.FeedSHA
			},
			nil},
		{"the policy was removed and the target changed", "pr",
			func(t *testing.T, pool *pgxpool.Pool, site *testenv.Site) {
				site.Config.Feeds[0].Approval = nil
				exec(t, pool, `INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('pr', 'M-1', 1, 'new', now(), 0)`)
			},
			func(v1, v2 *ledger.PlanView, c1, c2 target.PlanCounts) bool { return c2 != c1 },
			func(t *testing.T, r *rig, site *testenv.Site) {
				// without the policy, the next file is not planned against the target
				site.Drop(t, "orders-2.csv", goodRows("M", 2))
				r.poll("pr")
				if v, _, err := ops.PlanPage(context.Background(), r.pool, files(t, r.pool, "pr")[1].ID, []string{"pr"}, ledger.ChangeFilter{}, 0, 0, 0); err != nil || v.Hash != "" {
					t.Fatalf("a file without a policy was planned against the target: %+v %v", v, err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			ctx := context.Background()
			site := testenv.NewSite(t, tc.partner)
			site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-1.csv", goodRows("M", 2))
			r.poll(tc.partner)
			f := files(t, pool, tc.partner)[0]
			v1, c1 := planOf(t, pool, tc.partner, f.ID)
			if err := approve(ctx, pool, tc.partner, f.ID, v1.Hash); err != nil {
				t.Fatal(err)
			}
			r.d.Stop()
			tc.restart(t, pool, site)
			r = newRig(t, pool, "w1", site)
			r.poll(tc.partner)
			f = files(t, pool, tc.partner)[0]
			v2, c2 := planOf(t, pool, tc.partner, f.ID)
			if f.State != "awaiting_approval" || f.Reason != "plan_changed" || v2.Hash == v1.Hash || !tc.replanned(v1, v2, c1, c2) {
				t.Fatalf("file %+v: plan %s (%+v, feed %s) after the restart, approved %s (%+v, feed %s)", f, v2.Hash, c2, v2.FeedSHA, v1.Hash, c1, v1.FeedSHA)
			}
			if err := approve(ctx, pool, tc.partner, f.ID, v2.Hash); err != nil {
				t.Fatal(err)
			}
			r.poll(tc.partner)
			if f := files(t, pool, tc.partner)[0]; f.State != "archived" || f.Applied != 2 {
				t.Fatalf("file %+v", f)
			}
			if tc.then != nil {
				tc.then(t, r, site)
			}
		})
	}
}

// On a guarded target (intake_row_hash) the plan tells a row edited
// outside intake since intake wrote it, as the apply then does: the staged
// rows carry intake's own hash, and plan and apply judge them alike.
func TestPlanCountsAnOutsideEditAsTheApplyDoes(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site, r, _, _ := approvedFile(t, pool, "oe", "G")
	r.poll("oe")
	if f := files(t, pool, "oe")[0]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("first file %+v", f)
	}
	exec(t, pool, `UPDATE orders SET amount = 999 WHERE partner_id = 'oe' AND order_id = 'G-2'`) // edited outside intake
	site.Drop(t, "orders-2.csv", goodRows("G", 4))
	r.poll("oe")
	f2 := files(t, pool, "oe")[1]
	v2, c := planOf(t, pool, "oe", f2.ID)
	if f2.State != "awaiting_approval" || c.Creates != 1 || c.Unchanged != 2 || c.OutsideEdit != 1 || c.Updates != 0 {
		t.Fatalf("file %+v, plan %+v: want 1 create, 2 unchanged, 1 outside edit", f2, c)
	}
	if err := approve(ctx, pool, "oe", f2.ID, v2.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("oe")
	f2 = files(t, pool, "oe")[1]
	if f2.State != "archived" || f2.Applied != 1 || f2.Unchanged != 2 || f2.Confl != 1 {
		t.Fatalf("second file %+v, want 1 applied, 2 unchanged, 1 conflict as planned", f2)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'oe' AND order_id = 'G-2' AND amount = 999`); n != 1 {
		t.Fatal("the outside edit was overwritten")
	}
}

// The plan hash identifies what the plan does, not only how much: two
// plans of one file with the same counts over other rows (another key
// updated, another key deleted) have two hashes, so an approval of one
// never applies the other.
func TestPlanHashCoversThePlansContent(t *testing.T) {
	c := target.PlanCounts{Updates: 1, Unchanged: 1, Deletes: 1, Content: "1234 deletes 99"}
	h := intake.PlanHash("sha", "map", 2, c)
	if intake.PlanHash("sha", "map", 2, c) != h {
		t.Fatal("the plan hash is not a function of the plan")
	}
	for _, other := range []string{"1235 deletes 99", "1234 deletes 98"} {
		d := c
		d.Content = other
		if intake.PlanHash("sha", "map", 2, d) == h {
			t.Fatalf("plans with the same counts over other rows (%q, %q) share a hash", c.Content, other)
		}
	}
}

// changesOf lists the plan changes of intake id recorded in
// intake_plan_change: seq, action, key and each changed column with its
// old and new value, by seq.
func changesOf(t *testing.T, pool *pgxpool.Pool, id int64) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(concat_ws(' ', c.seq, c.action, c.key,
		    (SELECT string_agg(k || ' ' || (c.changed->k->>0) || '>' || (c.changed->k->>1), ' ' ORDER BY k) FROM jsonb_object_keys(c.changed) k)), '|' ORDER BY c.seq), '')
		FROM intake_plan_change c WHERE c.intake_id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// A guarded feed's plan resolves its target table before it takes its
// transaction's connection: a table not loaded yet is read on a
// connection of the pool, which on a 1-connection pool would never come
// while the transaction holds the only one.
func TestAPlanLoadsItsTargetBeforeItsTransaction(t *testing.T) {
	url, pool := testenv.DB(t)
	work := testenv.PoolWith(t, url, func(pc *pgxpool.Config) {
		pc.MaxConns = 1
		pc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName("w1")
	})
	site := testenv.NewSite(t, "ap")
	site.Config.Feeds[0].Approval = &partners.Approval{MaxUpdateRatio: ratio(0.5)}
	r := newRig(t, work, "w1", site) // no target loaded: the plan's is the first
	site.Drop(t, "orders-1.csv", goodRows("A", 4))
	r.poll("ap")
	f := files(t, pool, "ap")[0]
	if f.State != "archived" || f.Applied != 4 {
		t.Fatalf("got %+v, want archived with 4 rows applied", f)
	}
	if _, c := planOf(t, pool, "ap", f.ID); c.Creates != 4 {
		t.Fatalf("plan %+v, want 4 creates", c)
	}
}

// An approved file whose owner is gone is taken over into the poller's
// processing dir; when a live file of the same name (sent again, under
// another batch) already waits there, the approved one waits its turn and
// the poll goes on with the partner's other files; it is taken once the
// name's place is free.
func TestADecidedFileWaitsWhereItsNameIsHeldAndTheRestGoOn(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "held")
	site.Config.Readiness = partners.ReadinessManifest
	site.Config.Feeds[0].BatchID = partners.BatchIDRule{From: partners.BatchFromManifest}
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	drop := func(name, batch, body string) {
		site.Drop(t, name, body)
		site.Drop(t, name+".complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q, "batch_id": %q}`, len(body), sha(body), batch))
	}
	r := newRig(t, pool, "w1", site)
	drop("orders-1.csv", "b1", goodRows("A", 2))
	r.poll("held")
	r2 := newRig(t, pool, "w2", site)
	drop("orders-1.csv", "b2", goodRows("B", 2))
	r2.poll("held")
	fs := files(t, pool, "held")
	if len(fs) != 2 || fs[0].State != "awaiting_approval" || fs[1].State != "awaiting_approval" || fs[1].Worker != "w2" {
		t.Fatalf("rows %+v, want both files of the name awaiting approval, the second w2's", fs)
	}
	v1, _ := planOf(t, pool, "held", fs[0].ID)
	if err := approve(ctx, pool, "held", fs[0].ID, v1.Hash); err != nil {
		t.Fatal(err)
	}
	r.d.Stop() // the first file's owner is gone

	drop("orders-2.csv", "b3", goodRows("C", 2))
	r2.poll("held") // the approved file's place is held: it waits, the poll goes on
	fs = files(t, pool, "held")
	if len(fs) != 3 || fs[0].Worker != "w1" || fs[2].Name != "orders-2.csv" || fs[2].State != "awaiting_approval" {
		t.Fatalf("rows %+v, want the approved file left waiting and the partner's next file claimed", fs)
	}
	if err := ops.Reject(ctx, pool, ledger.PlanDecision{IntakeID: fs[1].ID, Partners: []string{"held"}, Actor: "bob", Reason: "resent by mistake"}); err != nil {
		t.Fatal(err)
	}
	r2.poll("held") // the rejected one is held, which frees the name's place
	r2.poll("held") // the approved one is taken over and applied
	fs = files(t, pool, "held")
	if fs[0].State != "archived" || fs[0].Worker != "w2" || fs[0].Applied != 2 || fs[1].State != "quarantined" {
		t.Fatalf("rows %+v, want the approved file archived by w2 and the rejected one held", fs)
	}
}

// An approved file whose move into the taker's processing dir is refused
// (here a directory holds its name there) stays where its owner left it:
// the row is pointed back at it, and it is applied from there, the
// approval kept.
func TestADecidedFileThatCannotBeMovedRunsWhereItIs(t *testing.T) {
	_, pool := testenv.DB(t)
	site, r, _, _ := approvedFile(t, pool, "nomove", "N")
	r.d.Stop() // its owner is gone
	if err := os.MkdirAll(filepath.Join(site.Root, "processing", "w2", "orders-1.csv"), 0o755); err != nil {
		t.Fatal(err)
	}
	r2 := newRig(t, pool, "w2", site)
	r2.poll("nomove")
	f := files(t, pool, "nomove")[0]
	if f.State != "archived" || f.Applied != 3 || f.Worker != "w2" {
		t.Fatalf("file %+v, want archived by w2 from where w1 left it", f)
	}
	if got := site.Files(t, "processing/w1"); len(got) != 0 {
		t.Fatalf("processing/w1 still holds %v", got)
	}
}

// awaitingFile is a partner whose feed makes every file wait for
// approval, with one file of 3 rows (order ids prefix-n) planned by w1:
// its site, w1's rig, the file and its plan.
func awaitingFile(t *testing.T, pool *pgxpool.Pool, partner, prefix string) (*testenv.Site, *rig, fileRow, *ledger.PlanView) {
	t.Helper()
	site := testenv.NewSite(t, partner)
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows(prefix, 3))
	r.poll(partner)
	f := files(t, pool, partner)[0]
	v, _ := planOf(t, pool, partner, f.ID)
	return site, r, f, v
}

// approvedFile is awaitingFile with the file approved.
func approvedFile(t *testing.T, pool *pgxpool.Pool, partner, prefix string) (*testenv.Site, *rig, fileRow, *ledger.PlanView) {
	t.Helper()
	site, r, f, v := awaitingFile(t, pool, partner, prefix)
	if err := approve(context.Background(), pool, partner, f.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	return site, r, f, v
}

// A decision whose transaction is still open (its commit in flight when
// the command lost its connection) is not settled as rolled back: Settle
// waits for it, says unknown past its wait, and recorded once it commits.
func TestSettleWaitsForADecisionStillInFlight(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	_, _, f, v := awaitingFile(t, pool, "inflight", "I")
	if err := fault.Set("ops:before_commit=pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	done := make(chan error, 1)
	go func() {
		done <- ops.Approve(ctx, pool, ledger.PlanDecision{IntakeID: f.ID, Partners: []string{"inflight"}, Actor: "alice", Reason: "ok", PlanHash: v.Hash, Request: "req-inflight"})
	}()
	select {
	case <-fault.Paused("ops:before_commit"):
	case err := <-done:
		t.Fatalf("the approval ended (%v) before its commit", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the approval never reached its commit")
	}
	if got, err := ops.Settle(ctx, pool, "req-inflight", 2*time.Second); got != ledger.SettledUnknown {
		t.Fatalf("settled %v (%v) while the decision's transaction was open, want unknown", got, err)
	}
	fault.Resume("ops:before_commit")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, err := ops.Settle(ctx, pool, "req-inflight", time.Minute); got != ledger.SettledRecorded || err != nil {
		t.Fatalf("settled %v (%v) once it committed, want recorded", got, err)
	}
}
