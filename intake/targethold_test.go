package intake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// returnsFeed is a second feed of a partner, writing the table named.
func returnsFeed(table string) partners.Feed {
	f := testenv.OrdersFeed()
	f.Name, f.Pattern, f.Target = "returns", `returns-.*\.csv`, table
	return f
}

// A feed whose target table cannot be written (here: it does not exist)
// holds only its own files: the daemon's start check passes, the other
// partner and the partner's other feed are applied, the held feed's files
// wait in ready/ untouched (no row, no receipt) without taking the poll's
// room from the others, and once ops create the table the files are
// taken when the hold's retry is due, with no restart. Before, the start
// check returned the first such error: the daemon did not start and
// `run --once` polled nobody.
func TestAFeedWhoseTargetCannotBeWrittenHoldsOnlyItsFiles(t *testing.T) {
	defer intake.SetTargetRetry(time.Hour)()
	_, pool := testenv.DB(t)
	ctx := context.Background()
	alpha := testenv.NewSite(t, "th-alpha")
	beta := testenv.NewSite(t, "th-beta")
	beta.Config.Feeds = append(beta.Config.Feeds, returnsFeed("th_returns"))
	beta.Config.Limits.MaxFilesPerPoll = 1 // the held feed's older files must not take the one place

	old := time.Now().Add(-time.Hour)
	for _, name := range []string{"returns-1.csv", "returns-2.csv"} {
		beta.Drop(t, name, testenv.OrdersCSV("R"+name[8:9], 3))
		if err := os.Chtimes(filepath.Join(beta.Root, "ready", name), old, old); err != nil {
			t.Fatal(err)
		}
	}
	beta.Drop(t, "orders-b.csv", testenv.OrdersCSV("B", 3))
	alpha.Drop(t, "orders-a.csv", testenv.OrdersCSV("A", 3))

	r := newRig(t, pool, "th", alpha, beta)
	if err := r.d.CheckTargets(ctx); err != nil {
		t.Fatalf("the start check failed for one feed's table: %v", err)
	}
	if got, want := r.d.HeldFeeds(), []string{"th-beta/returns"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("held feeds %v, want %v", got, want)
	}
	r.poll("th-alpha")
	r.poll("th-beta")

	archived := func(partner, name string) bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND remote_name = $2 AND state = 'archived'`,
			partner, name) == 1
	}
	if !archived("th-alpha", "orders-a.csv") || !archived("th-beta", "orders-b.csv") {
		t.Fatalf("the files of the feeds that can be written were not applied: alpha %+v beta %+v",
			files(t, pool, "th-alpha"), files(t, pool, "th-beta"))
	}
	held := func() {
		t.Helper()
		if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'th-beta' AND remote_name LIKE 'returns-%'`); n != 0 {
			t.Fatalf("%d rows for the held feed's files, want none", n)
		}
		if got := beta.Files(t, "ready"); !reflect.DeepEqual(got, []string{"returns-1.csv", "returns-2.csv"}) {
			t.Fatalf("ready/ holds %v, want the held feed's two files untouched", got)
		}
		for _, rep := range beta.Files(t, "reports") {
			if strings.HasPrefix(rep, "returns-") {
				t.Fatalf("a report for a held file: %s", rep)
			}
		}
		if v := testutil.ToFloat64(r.d.Metrics().TargetHeld.WithLabelValues("th-beta", "returns")); v != 1 {
			t.Fatalf("intake_feed_target_held{th-beta,returns} = %v, want 1", v)
		}
		if st := r.d.PartnerStates()["th-beta"]; !strings.Contains(st.HeldFeeds["returns"], "does not exist") {
			t.Fatalf("/readyz's partner state names no held feed: %+v", st)
		}
	}
	held()
	// a feed not held has no series (absent reads as 0)
	if n := testutil.CollectAndCount(r.d.Metrics().TargetHeld); n != 1 {
		t.Fatalf("intake_feed_target_held has %d series, want the held feed's alone", n)
	}
	if v := testutil.ToFloat64(r.d.Metrics().Skipped.WithLabelValues("th-beta", string(reason.TargetUnusable))); v != 2 {
		t.Fatalf("skipped{target_unusable} = %v, want the 2 files of one listing", v)
	}

	// ops create the table: the hold stands until its retry is due
	if _, err := pool.Exec(ctx, strings.Replace(testenv.TargetDDL, "TABLE orders", "TABLE th_returns", 1)); err != nil {
		t.Fatal(err)
	}
	beta.Drop(t, "orders-b2.csv", testenv.OrdersCSV("C", 2))
	r.poll("th-beta")
	if !archived("th-beta", "orders-b2.csv") {
		t.Fatalf("the partner's other feed stopped: %+v", files(t, pool, "th-beta"))
	}
	held()

	// the retry due: read again without a listing (as every replica's
	// gauge loop does, whether files wait or not)
	intake.HeldFeedsDue(r.d)
	if err := r.d.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.d.HeldFeeds(); len(got) != 0 {
		t.Fatalf("still held once its table exists and its retry is due: %v", got)
	}
	if n := testutil.CollectAndCount(r.d.Metrics().TargetHeld); n != 0 {
		t.Fatalf("intake_feed_target_held has %d series after the table was made, want none", n)
	}
	r.poll("th-beta") // the place of max_files_per_poll 1: one file a poll
	r.poll("th-beta")
	for _, name := range []string{"returns-1.csv", "returns-2.csv"} {
		if !archived("th-beta", name) {
			t.Fatalf("%s not applied once its table exists: %+v", name, files(t, pool, "th-beta"))
		}
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM th_returns WHERE partner_id = 'th-beta'`); n != 6 {
		t.Fatalf("%d rows in the held feed's table, want 6", n)
	}
}

// A file of a feed that is held when its owner comes back (it waited for
// its next attempt; its table was renamed meanwhile) waits: its run stops
// before the table and defers it without counting an attempt, its owner
// keeps its lease (no reconciler takes it over), and the partner hears
// nothing; once the table is back and the hold ends, it is applied.
func TestAHeldFeedsFileInFlightWaitsWithoutSpendingAttempts(t *testing.T) {
	defer intake.SetTargetRetry(time.Hour)()
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "th-res")
	id := site.Config.ID
	site.Drop(t, "orders-r.csv", testenv.OrdersCSV("R", 4))
	r0 := newRig(t, pool, "thres", site)
	if err := fault.Set("apply:mid_chunk=error"); err != nil {
		t.Fatal(err)
	}
	r0.d.PollOnce(ctx, id) // the file fails its first attempt and waits for its next
	fault.Set("")
	r0.d.Stop()
	row := func() string {
		return strings.Join(testenv.Strings(t, pool, `SELECT state || '/' || attempts FROM file_intake WHERE partner_id = $1`, id), ",")
	}
	before := row()
	if before == "" || strings.HasPrefix(before, "archived") {
		t.Fatalf("the file did not wait for a next attempt: %q", before)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders RENAME TO orders_away;
		UPDATE file_intake SET next_attempt_at = now() - interval '1 second' WHERE partner_id = 'th-res'`); err != nil {
		t.Fatal(err)
	}

	r := newRig(t, pool, "thres", site) // its owner back
	if err := r.d.CheckTargets(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.d.HeldFeeds(); !reflect.DeepEqual(got, []string{"th-res/orders"}) {
		t.Fatalf("held feeds %v", got)
	}
	r.poll(id)
	r.poll(id)
	if got := row(); got != before {
		t.Fatalf("the held feed's file went %q -> %q: resumed while its table cannot be written", before, got)
	}
	if reps := site.Files(t, "reports"); len(reps) != 0 {
		t.Fatalf("the partner was told something about a held file: %v", reps)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND lease_until > now() AND next_attempt_at > now()`, id); n != 1 {
		t.Fatal("the held file is not deferred under a live lease: a reconciler would take it over")
	}

	if _, err := pool.Exec(ctx, `ALTER TABLE orders_away RENAME TO orders`); err != nil {
		t.Fatal(err)
	}
	intake.HeldFeedsDue(r.d)
	if err := r.d.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	// its deferred attempt due (a retry later: 30 s outside this test)
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET next_attempt_at = now() - interval '1 second' WHERE partner_id = 'th-res'`); err != nil {
		t.Fatal(err)
	}
	r.poll(id)
	if fs := files(t, pool, id); len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 4 {
		t.Fatalf("after the table came back: %+v", fs)
	}
}

// A reload that adds a partner whose table does not exist yet is taken,
// and holds that feed; a reload that would hold a feed the config in
// force writes is refused, and the feed goes on with the mapping in force.
func TestAReloadHoldsANewFeedButKeepsAWorkingOne(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	a := testenv.NewSite(t, "thr-a")
	a.Config.Poll = "@every 1s"
	r := newRig(t, pool, "thr", a)
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}

	n := testenv.NewSite(t, "thr-new")
	n.Config.Poll = "@every 1s"
	n.Config.Feeds[0].Target = "thr_missing"
	res, err := r.d.Reload(ctx, []partners.Config{a.Validated(t), n.Validated(t)})
	if err != nil {
		t.Fatalf("a reload adding a partner whose table is not made yet: %v", err)
	}
	if !reflect.DeepEqual(res.Added, []string{"thr-new"}) {
		t.Fatalf("reload: %+v", res)
	}
	if got, want := r.d.HeldFeeds(), []string{"thr-new/orders"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("held feeds %v, want %v", got, want)
	}

	// refused: a partner it would add and one it would change show
	// nothing of the refused config in their gauges
	ghost := testenv.NewSite(t, "thr-ghost")
	ghost.Config.SFTP.LegacyAlgorithms = true
	broken := a.Validated(t)
	broken.Feeds[0].Target = "thr_missing"
	broken.SFTP.LegacyAlgorithms = true
	if _, err := r.d.Reload(ctx, []partners.Config{ghost.Validated(t), broken, n.Validated(t)}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a reload holding a feed the config in force writes: %v, want refused", err)
	}
	legacy := r.d.Metrics().LegacySSH
	if n := testutil.CollectAndCount(legacy); n != 2 {
		t.Fatalf("%d intake_partner_legacy_ssh_algorithms series after the refused reload, want thr-a's and thr-new's", n)
	}
	if v := testutil.ToFloat64(legacy.WithLabelValues("thr-a")); v != 0 {
		t.Fatalf("intake_partner_legacy_ssh_algorithms{partner=thr-a} = %v after a refused reload that set it", v)
	}
	a.Drop(t, "orders-kept.csv", testenv.OrdersCSV("K", 2))
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'thr-a' AND remote_name = 'orders-kept.csv' AND state = 'archived'`) == 1
	})
	if got, want := r.d.HeldFeeds(), []string{"thr-new/orders"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after the refused reload: held feeds %v, want %v", got, want)
	}
}

// A reload whose context ended (a stop signal) after its last step that
// waits on it does not come into force: a partner it adds is not polled,
// and the reload says why.
func TestAReloadWhoseContextEndedDoesNotComeIntoForce(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	a := testenv.NewSite(t, "rlc-a")
	a.Config.Poll = "@every 1s"
	r := newRig(t, pool, "rlc", a)
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n := testenv.NewSite(t, "rlc-new")
	n.Config.Poll = "@every 1s"
	n.Config.SFTP.LegacyAlgorithms = true
	// the stop comes once every step of the reload is done
	if err := fault.Set("reload:in_force=pause"); err != nil {
		t.Fatal(err)
	}
	defer fault.Set("")
	stopped, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := r.d.Reload(stopped, []partners.Config{a.Validated(t), n.Validated(t)})
		done <- err
	}()
	select {
	case <-fault.Paused("reload:in_force"):
	case err := <-done:
		t.Fatalf("the reload ended before it came into force: %v", err)
	}
	stop()
	fault.Resume("reload:in_force")
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("reload whose context ended: %v, want context.Canceled", err)
	}
	if n := testutil.CollectAndCount(r.d.Metrics().LegacySSH); n != 1 {
		t.Fatalf("%d intake_partner_legacy_ssh_algorithms series, want rlc-a's alone", n)
	}
	n.Drop(t, "orders-late.csv", testenv.OrdersCSV("L", 2))
	a.Drop(t, "orders-a.csv", testenv.OrdersCSV("A", 2))
	waitUntil(t, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'rlc-a' AND state = 'archived'`) == 1
	})
	if got := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'rlc-new'`); got != 0 {
		t.Fatalf("the partner of a reload that did not come into force took %d files", got)
	}
}

// claim: record: the files a held feed took already stay in ready/ and
// keep their records renewed by each listing while the feed is held, so
// a hold longer than the records' 7 days does not make them new again.
func TestAHeldFeedKeepsItsRecordClaims(t *testing.T) {
	defer intake.SetTargetRetry(time.Hour)()
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := readOnlySite(t)
	if err := os.WriteFile(filepath.Join(site.Root, "ready", "orders-rec.csv"), []byte(goodRows("REC", 3)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := intake.Config{WorkerID: "threc", Lease: 30 * time.Second, SpoolMinFree: 1, Affinity: intake.AffinityNone}
	a := newRigCfg(t, pool, cfg, site)
	a.poll("ro")
	waitStable(t, pool, "ro", "orders-rec.csv", time.Second)
	a.poll("ro")
	if fs := files(t, pool, "ro"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("files %+v, want the file taken", fs)
	}
	a.d.Stop()
	if _, err := pool.Exec(ctx, `ALTER TABLE orders RENAME TO orders_away;
		UPDATE intake_record_claim SET last_seen = now() - interval '8 days' WHERE partner_id = 'ro'`); err != nil {
		t.Fatal(err)
	}
	b := newRigCfg(t, pool, cfg, site)
	if err := b.d.CheckTargets(ctx); err != nil {
		t.Fatal(err)
	}
	b.poll("ro")
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_record_claim WHERE partner_id = 'ro' AND last_seen > now() - interval '1 hour'`); n != 1 {
		t.Fatalf("%d renewed records, want the taken file's: a held feed's listing forgot it", n)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders_away RENAME TO orders`); err != nil {
		t.Fatal(err)
	}
	intake.HeldFeedsDue(b.d)
	if err := b.d.RefreshGauges(ctx); err != nil {
		t.Fatal(err)
	}
	b.poll("ro")
	if fs := files(t, pool, "ro"); len(fs) != 1 {
		t.Fatalf("files %+v: the file was taken again after the hold", fs)
	}
}
