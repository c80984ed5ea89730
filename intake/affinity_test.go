package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// Two started replicas split the partners: each partner's files are
// claimed by the one replica affinity picks, none is raced for; when a
// replica stops, the other takes its partners on its next poll.
func TestReplicasSplitPartnersAndTakeOverOnStop(t *testing.T) {
	_, pool := testenv.DB(t)
	var sites []*testenv.Site
	for i := 0; i < 6; i++ {
		s := testenv.NewSite(t, fmt.Sprintf("aff%d", i))
		s.Config.Poll = "@every 1s"
		sites = append(sites, s)
	}
	want := map[string]string{} // partner -> replica
	owned := map[string]int{}
	for _, s := range sites {
		o := intake.Owner(s.Config.ID, []string{"r1", "r2"})
		want[s.Config.ID] = o
		owned[o]++
	}
	if owned["r1"] == 0 || owned["r2"] == 0 {
		t.Fatalf("the test needs partners on both replicas, got %v", owned)
	}
	r1, r2 := newRig(t, pool, "r1", sites...), newRig(t, pool, "r2", sites...)
	var ids []string
	for _, s := range sites {
		ids = append(ids, s.Config.ID)
	}
	intake.Signals(r1.d).Polled.Init(t)
	intake.Signals(r1.d).Peers.Init(t)
	intake.Signals(r2.d).Polled.Init(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// r1 alone polls every partner; then r2 joins and takes its share
	if err := r1.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r1.d.Stop()
	waitPolls(t, r1, ids)
	if err := r2.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Both are registered. r2 saw r1 from its first poll on; r1 sees r2
	// once it reads the live replicas again, and then polls each partner
	// under that view.
	intake.Signals(r1.d).Peers.WaitFor(func(serving map[string][]string) bool {
		for _, id := range ids {
			if !slices.Contains(serving[id], "r2") {
				return false
			}
		}
		return true
	})
	pollsAfter(t, r1, ids)
	waitPolls(t, r2, ids)
	for i, s := range sites {
		for j := 0; j < 3; j++ {
			s.Drop(t, fmt.Sprintf("orders-%d-%d.csv", i, j), testenv.OrdersCSV(fmt.Sprintf("A%d%d", i, j), 2))
		}
		r1.d.Poke(s.Config.ID) // the owner polls now, not at its next tick
		r2.d.Poke(s.Config.ID)
	}
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE state = 'archived'`) == 18
	})
	for _, s := range sites {
		for _, f := range files(t, pool, s.Config.ID) {
			if f.Worker != want[s.Config.ID] {
				t.Fatalf("partner %s: %s was processed by %s, affinity picks %s", s.Config.ID, f.Name, f.Worker, want[s.Config.ID])
			}
		}
		for _, r := range []*rig{r1, r2} {
			if lost := testutil.ToFloat64(r.d.Metrics().ClaimsLost.WithLabelValues(s.Config.ID)); lost != 0 {
				t.Fatalf("partner %s: %v claims lost, want none (one replica polls it)", s.Config.ID, lost)
			}
		}
	}

	// each replica speaks only for the partners it polls: a stale "up" or
	// backlog gauge of a non-owner would mask or fake the owner's alerts
	for _, r := range []*rig{r1, r2} {
		name := map[*rig]string{r1: "r1", r2: "r2"}[r]
		if n := testutil.CollectAndCount(r.d.Metrics().PartnerUp); n != owned[name] {
			t.Fatalf("%s exports intake_partner_up for %d partners, it polls %d", name, n, owned[name])
		}
		for id, st := range r.d.PartnerStates() { // the /readyz body
			if mine := want[id] == name; st.PolledElsewhere == mine || (!mine && (st.Up || !st.LastOK.IsZero())) || (mine && !st.Up) {
				t.Fatalf("%s reports partner %s as %+v; it polls it: %v", name, id, st, mine)
			}
		}
	}

	// `intake status` says who polls each partner
	rows, err := ops.Status(ctx, pool, ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		if row.Poller != want[row.Partner] || len(row.Replicas) != 2 {
			t.Fatalf("status of %s: replicas %v, poller %q; want both, %s polling", row.Partner, row.Replicas, row.Poller, want[row.Partner])
		}
	}

	r2.d.Stop() // retires r2: r1 takes its partners at once, not a lease later
	for i, s := range sites {
		s.Drop(t, fmt.Sprintf("orders-%d-late.csv", i), testenv.OrdersCSV(fmt.Sprintf("L%d", i), 2))
	}
	archived := func() int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE state = 'archived'`)
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { return archived() == 24 }, // the lease is 30 s
		func() string {
			return fmt.Sprintf("r1 did not take over the stopped replica's partners: %d of 24 archived", archived())
		})
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE remote_name LIKE '%late%' AND worker_id <> 'r1'`); n != 0 {
		t.Fatalf("%d late files processed by another replica than r1", n)
	}
	if rows, err = ops.Status(ctx, pool, ids); err != nil || rows[0].Poller != "r1" || len(rows[0].Replicas) != 1 {
		t.Fatalf("status after r2 stopped: %+v %v", rows[0], err)
	}
}

// A replica that did not stop drained (a crash) still looks into its own
// processing dir of a partner another replica polls, and finishes what it
// left there; one that stopped drained, with no live file of the partner,
// does not even connect to it.
func TestNonOwnerResumesItsOwnLeftoversOnlyAfterACrash(t *testing.T) {
	_, pool := testenv.DB(t)
	var site *testenv.Site
	for i := 0; site == nil; i++ { // a partner that affinity gives to r1
		if id := fmt.Sprintf("left%d", i); intake.Owner(id, []string{"r1", "r2"}) == "r1" {
			site = testenv.NewSite(t, id)
		}
	}
	site.Config.Poll = "@every 1s"
	id := site.Config.ID
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r1 := newRig(t, pool, "r1", site)
	if err := r1.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r1.d.Stop()

	// r2 crashed between its claim's rename and the row, a moment ago: a
	// file in processing/r2/ without a row, and an intake_worker row not
	// drained, seen within its lease (so r1, polling every second, does
	// not take r2 for gone and adopt the file before r2 starts again)
	if _, err := pool.Exec(ctx, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('r2', 'gone', 1, '30 s', ARRAY[$1], now())`, id); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(site.Root, "processing", "r2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "orders-left.csv"), []byte(testenv.OrdersCSV("LEFT", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	r2 := newRig(t, pool, "r2", site)
	if err := r2.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE worker_id = 'r2' AND remote_name = 'orders-left.csv' AND state = 'archived'`) == 1
	})
	r2.d.Stop() // drained this time

	r2b := newRig(t, pool, "r2", site)
	intake.Signals(r2b.d).Polled.Init(t)
	if err := r2b.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r2b.d.Stop()
	site.Drop(t, "orders-new.csv", testenv.OrdersCSV("NEW", 2))
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE remote_name = 'orders-new.csv' AND state = 'archived'`) == 1
	})
	pollsAfter(t, r2b, []string{id}) // r2b's loop went through the partner again
	if n := testutil.ToFloat64(r2b.d.Metrics().Polls.WithLabelValues(id)); n != 0 {
		t.Fatalf("r2 restarted after a drained stop polled %s %v times, want none (r1 polls it)", id, n)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE remote_name = 'orders-new.csv' AND worker_id = 'r1'`); n != 1 {
		t.Fatal("the new file was not processed by the partner's replica r1")
	}
}

// With affinity "none" every started replica polls every partner.
func TestAffinityNoneLetsEveryReplicaPoll(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "every")
	site.Config.Poll = "@every 1s"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rigs []*rig
	for _, w := range []string{"r1", "r2"} {
		r := newRigCfg(t, pool, intake.Config{WorkerID: w, Lease: 30 * time.Second, SpoolMinFree: 1, Affinity: intake.AffinityNone}, site)
		intake.Signals(r.d).Polled.Init(t)
		if err := r.d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer r.d.Stop()
		rigs = append(rigs, r)
	}
	for _, r := range rigs {
		waitPolls(t, r, []string{"every"})
		r.d.Poke("every")
		waitPolls(t, r, []string{"every"})
		if n := testutil.ToFloat64(r.d.Metrics().Polls.WithLabelValues("every")); n < 2 {
			t.Fatalf("%s counted %v polls of the partner, want 2 or more", intake.WorkerID(r.d), n)
		}
	}
}

// waitPolls waits until r's loop has finished a successful poll of each
// partner (its Polled signal initialised before Start); a poll another
// replica owns counts, as the loop went through it.
func waitPolls(t *testing.T, r *rig, ids []string) {
	t.Helper()
	left := map[string]bool{}
	for _, id := range ids {
		left[id] = true
	}
	for len(left) > 0 {
		p := intake.Signals(r.d).Polled.WaitFor(func(p intake.PollDone) bool { return p.Err == nil && left[p.Partner] })
		delete(left, p.Partner)
	}
}

// pollsAfter waits until r's loop has been through each partner in a poll
// that began after the call: the first poll to finish after it may have
// begun before; the next one (poked at once) cannot have.
func pollsAfter(t *testing.T, r *rig, ids []string) {
	t.Helper()
	sig := &intake.Signals(r.d).Polled
	sig.Clear()
	seen := map[string]int{}
	for _, id := range ids {
		seen[id] = 0
		r.d.Poke(id)
	}
	for done := 0; done < len(ids); {
		p := sig.WaitOrTimeout()
		n, ok := seen[p.Partner]
		if !ok {
			continue
		}
		seen[p.Partner] = n + 1
		switch n + 1 {
		case 1:
			r.d.Poke(p.Partner)
		case 2:
			done++
		}
	}
}

// A file whose owner died is taken over by the reconciler of a replica
// that does not poll its partner: that replica runs it at once (the
// reconciler tells its daemon, TakenOver), instead of leaving it until
// its lease expires and a reconciler takes it over again.
func TestAFileTakenOverByAReplicaThatDoesNotPollThePartnerIsRun(t *testing.T) {
	_, pool := testenv.DB(t)
	var site *testenv.Site
	for i := 0; site == nil; i++ { // a partner that affinity gives to r1
		if id := fmt.Sprintf("tko%d", i); intake.Owner(id, []string{"r1", "r2"}) == "r1" {
			site = testenv.NewSite(t, id)
		}
	}
	site.Config.Poll = "@every 1h"
	id := site.Config.ID
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// r0 applies a file's rows and dies before its archive
	site.Drop(t, "orders-t.csv", testenv.OrdersCSV("T", 5))
	r0 := newRig(t, pool, "r0", site)
	if err := fault.Set("apply:after_commit=error"); err != nil {
		t.Fatal(err)
	}
	err := r0.d.PollOnce(ctx, id)
	fault.Set("")
	if !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected stop after commit", err)
	}
	r0.d.Stop()
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET lease_until = now() - interval '1 second' WHERE worker_id = 'r0'`); err != nil {
		t.Fatal(err)
	}

	var rigs []*rig
	for _, w := range []string{"r1", "r2"} {
		r := newRig(t, pool, w, site)
		intake.Signals(r.d).Polled.Init(t)
		if err := r.d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer r.d.Stop()
		waitPolls(t, r, []string{id}) // r2's first poll: nothing of its own, r1 polls the partner
		rigs = append(rigs, r)
	}
	r2 := rigs[1]
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{}, "r2", 30*time.Second, pool, sp, []partners.Config{site.Validated(t)},
		prometheus.NewRegistry(), testenv.Logger(t), r2.d.TakenOver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rec.Stop)
	fs, err := rec.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Kind != ledger.KindLeaseExpired {
		t.Fatalf("findings %+v, want one lease_expired", fs)
	}
	pollsAfter(t, r2, []string{id}) // the poll TakenOver asked for has run
	f := testenv.Files(t, pool, id)[0]
	if f.State != "archived" || f.Worker != "r2" || f.Applied != 5 {
		t.Fatalf("got %+v, want archived by r2 with its 5 rows applied once", f)
	}
	testenv.AssertExactOrders(t, pool, id, 5, "T")
}

// A replica that polled a partner, and whose poll failed right after a
// claim's RENAME (the row never written), no longer polls the partner once
// another replica starts and affinity gives the partner to it. The file
// in its processing dir is still its own to adopt: no replica adopts from
// a live one's dir. It looks there again on its next turn at the partner,
// though it no longer polls it, and the file is applied.
func TestAReplicaThatLostAPartnerAfterAFailedClaimStillAdoptsItsFile(t *testing.T) {
	_, pool := testenv.DB(t)
	var site *testenv.Site
	for i := 0; site == nil; i++ { // a partner that affinity gives to r2 once it runs
		if id := fmt.Sprintf("moved%d", i); intake.Owner(id, []string{"r1", "r2"}) == "r2" {
			site = testenv.NewSite(t, id)
		}
	}
	site.Config.Poll = "@every 1h" // polled by hand below
	id := site.Config.ID
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := func(w string) intake.Config {
		return intake.Config{WorkerID: w, Lease: 3 * time.Second, SpoolMinFree: 1}
	}
	r1 := newRigCfg(t, pool, cfg("r1"), site)
	intake.Signals(r1.d).Polled.Init(t)
	if err := r1.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r1.d.Stop()
	// the loop's first poll, before any file is there
	intake.Signals(r1.d).Polled.WaitFor(func(p intake.PollDone) bool { return p.Partner == id })

	site.Drop(t, "orders-moved.csv", testenv.OrdersCSV("MV", 2))
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r1.d.PollOnce(ctx, id); err == nil {
		t.Fatal("the poll went past its claim's RENAME")
	}
	fault.Set("")
	if got := site.Files(t, filepath.Join("processing", "r1")); len(got) != 1 {
		t.Fatalf("processing/r1 holds %v, want the claimed file", got)
	}

	r2 := newRigCfg(t, pool, cfg("r2"), site)
	if err := r2.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r2.d.Stop()
	// r1 reads the live replicas again (as a third of a lease on) and
	// sees r2: the partner is r2's now
	intake.Signals(r1.d).Peers.Init(t)
	intake.ExpirePeers(r1.d)
	r1.poll(id)
	intake.Signals(r1.d).Peers.WaitFor(func(serving map[string][]string) bool {
		return slices.Contains(serving[id], "r2")
	})
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE remote_name = 'orders-moved.csv' AND worker_id = 'r1' AND state = 'archived'`); n != 1 {
		t.Fatalf("%d archived rows of the file by r1, want 1: its claim without a row was left in processing/r1", n)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}
