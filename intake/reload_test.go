package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pkg/sftp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// A reload while a file is in flight: the file finishes on the mapping it
// was planned with (three chunks of two rows), the changed partner's next
// file takes the new one (one chunk), an added partner is polled, a
// removed one is gone, and a reload that changes nothing keeps every
// partner's runtime.
func TestReloadKeepsAFileInFlightOnItsMapping(t *testing.T) {
	_, pool := testenv.DB(t)
	a, b, c := testenv.NewSite(t, "rl-a"), testenv.NewSite(t, "rl-b"), testenv.NewSite(t, "rl-c")
	for _, s := range []*testenv.Site{a, b, c} {
		s.Config.Poll = "@every 1s"
	}
	a.Config.Feeds[0].ChunkRows = 2
	r := newRig(t, pool, "rl", a, b)
	if err := fault.Set("apply:mid_chunk=pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	a.Drop(t, "orders-a1.csv", testenv.OrdersCSV("A", 5))
	ctx := context.Background()
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fault.Paused("apply:mid_chunk"):
	case <-time.After(time.Minute):
		t.Fatal("the file never reached its first chunk")
	}

	a2 := a.Validated(t)
	a2.Feeds[0].ChunkRows = 10
	next := []partners.Config{a2, c.Validated(t)}
	res, err := r.d.Reload(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	want := intake.ReloadResult{Added: []string{"rl-c"}, Removed: []string{"rl-b"}, Changed: []string{"rl-a"}}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("reload: %+v, want %+v", res, want)
	}
	if err := r.d.PollOnce(ctx, "rl-b"); err == nil {
		t.Fatal("the removed partner can still be polled")
	}
	c.Drop(t, "orders-c1.csv", testenv.OrdersCSV("C", 3))
	fault.Resume("apply:mid_chunk")

	chunks := func(partner, name string) int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk k JOIN file_intake f USING (intake_id)
			WHERE f.partner_id = $1 AND f.remote_name = $2`, partner, name)
	}
	archived := func(partner, name string) bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND remote_name = $2 AND state = 'archived'`,
			partner, name) == 1
	}
	waitUntil(t, func() bool { return archived("rl-a", "orders-a1.csv") })
	if n := chunks("rl-a", "orders-a1.csv"); n != 3 {
		t.Fatalf("the file in flight has %d chunks, want 3 (chunk_rows 2, as planned)", n)
	}
	a.Drop(t, "orders-a2.csv", testenv.OrdersCSV("B", 5))
	waitUntil(t, func() bool { return archived("rl-a", "orders-a2.csv") && archived("rl-c", "orders-c1.csv") })
	if n := chunks("rl-a", "orders-a2.csv"); n != 1 {
		t.Fatalf("the next file has %d chunks, want 1 (chunk_rows 10, reloaded)", n)
	}

	if res, err := r.d.Reload(ctx, next); err != nil || res.Changes() {
		t.Fatalf("the same partners again: %+v %v, want no change", res, err)
	}
	r.d.Stop()
	if _, err := r.d.Reload(ctx, next); !errors.Is(err, intake.ErrNotRunning) {
		t.Fatalf("reload after Stop: %v", err)
	}
}

// startRemovalRig starts a daemon of worker "un" serving the partners un-a
// and un-b (polled by hand), past their first polls.
func startRemovalRig(t *testing.T, pool *pgxpool.Pool, cfg intake.Config) (r *rig, a, b *testenv.Site) {
	t.Helper()
	a, b = testenv.NewSite(t, "un-a"), testenv.NewSite(t, "un-b")
	for _, s := range []*testenv.Site{a, b} {
		s.Config.Poll = "@every 1h" // polled by hand
	}
	cfg.WorkerID, cfg.Lease, cfg.SpoolMinFree = "un", 30*time.Second, 1
	r = newRigCfg(t, pool, cfg, a, b)
	intake.Signals(r.d).Polled.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for seen := map[string]bool{}; len(seen) < 2; { // the first polls, nothing there yet
		seen[intake.Signals(r.d).Polled.WaitOrTimeout().Partner] = true
	}
	return r, a, b
}

// stoppedDrained stops the rig's daemon and reports whether it recorded
// its run as drained.
func stoppedDrained(t *testing.T, r *rig, worker string) bool {
	t.Helper()
	r.d.Stop()
	var drained bool
	if err := r.pool.QueryRow(context.Background(), `SELECT drained_at IS NOT NULL FROM intake_worker WHERE worker_id = $1`, worker).Scan(&drained); err != nil {
		t.Fatal(err)
	}
	return drained
}

// A reload removes a partner whose last poll failed right after a claim's
// RENAME: a file in processing/<worker>/ without a row, which nothing
// would look at again while the daemon runs (no other replica adopts from
// a live worker's dir, and the reconciler follows the new partners). The
// reload is refused naming the claim, and the config in force is kept;
// the next poll adopts and archives the file, and the same reload is then
// taken, the stop recording a drained run. Taken at once, the reload
// would strand the claim.
func TestAReloadThatRemovesAPartnerWaitsForAClaimWithoutARow(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	a.Drop(t, "orders-1.csv", goodRows("U", 2))
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "un-a"); err == nil {
		t.Fatal("the poll went past its claim's RENAME")
	}
	fault.Set("")
	onlyB := []partners.Config{b.Validated(t)}
	_, err := r.d.Reload(ctx, onlyB)
	if !errors.Is(err, intake.ErrProcessingInUse) || !strings.Contains(err.Error(), "removes the partner") ||
		!strings.Contains(err.Error(), "processing/un/orders-1.csv (no row)") {
		t.Fatalf("reload removing a partner over its claim without a row: %v, want it refused naming the claim", err)
	}
	r.poll("un-a") // under the config in force: adopts and archives it
	if fs := files(t, pool, "un-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim adopted and archived", fs)
	}
	res, err := r.d.Reload(ctx, onlyB)
	if err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload once the claim is finished: %+v, %v", res, err)
	}
	if !stoppedDrained(t, r, "un") {
		t.Fatal("the stop did not record a drained run, with nothing of the removed partner left")
	}
}

// A reload removes a partner while a row of this worker is still live: a
// file failed transiently and waits for its next attempt (the poll itself
// went well, so the partner is settled). Only this worker's polls resume
// it; removed, it would wait for good on a daemon that serves the partner
// alone. The reload is refused naming the intake; once the file is
// finished the same reload is taken.
func TestAReloadThatRemovesAPartnerWaitsForThisWorkersLiveRows(t *testing.T) {
	_, pool := testenv.DB(t)
	poison(t, pool, "L-2", "")
	r, a, b := startRemovalRig(t, pool, intake.Config{Retry: intake.RetryPolicy{Attempts: 10, Base: time.Millisecond, Max: time.Millisecond}})
	ctx := context.Background()
	a.Drop(t, "orders-1.csv", goodRows("L", 3))
	r.poll("un-a") // the file fails transiently; the poll goes on
	fs := files(t, pool, "un-a")
	if len(fs) != 1 || fs[0].State == "archived" || fs[0].Worker != "un" {
		t.Fatalf("rows %+v, want one live row of worker un", fs)
	}
	onlyB := []partners.Config{b.Validated(t)}
	_, err := r.d.Reload(ctx, onlyB)
	if !errors.Is(err, intake.ErrProcessingInUse) || !strings.Contains(err.Error(), fmt.Sprintf("intake %d", fs[0].ID)) {
		t.Fatalf("reload removing a partner under a live row of this worker: %v, want it refused naming intake %d", err, fs[0].ID)
	}
	exec(t, pool, `DELETE FROM poison_on`) // the cause fixed
	waitDue(t, pool, "un-a")
	r.poll("un-a")
	if fs := files(t, pool, "un-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the file archived", fs)
	}
	if res, err := r.d.Reload(ctx, onlyB); err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload once the file is finished: %+v, %v", res, err)
	}
}

// A reload that removes a partner during its poll waits for the poll to
// end (its file finishes in it) rather than refusing, and the removal is
// then taken: nothing is left.
func TestAReloadThatRemovesAPartnerWaitsForItsPollInProgress(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	a.Drop(t, "orders-1.csv", goodRows("W", 2))
	resume := r.pollPaused("un-a", "claim:before_rename")
	done := make(chan error, 1)
	go func() {
		res, err := r.d.Reload(context.Background(), []partners.Config{b.Validated(t)})
		if err == nil && !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
			err = fmt.Errorf("removed %v, want un-a", res.Removed)
		}
		done <- err
	}()
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("reload removing a partner during its poll: %v, want it taken once the poll ended", err)
	}
	if fs := files(t, pool, "un-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the file of the poll archived", fs)
	}
}

// Only the claims of this worker and of replicas no longer alive hold a
// removal up: other replicas still serving the partner look after
// theirs. A partner whose last poll failed (before any claim: nothing of
// this worker is in its processing dir) is removed while a live other
// worker's dir holds an entry; the reload finds this worker's dir empty,
// and the stop records a drained run.
func TestAReloadRemovesAPartnerWhoseOtherWorkersStillHoldClaims(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	execArgs(t, pool, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('un-other', 'h', 1, interval '1 hour', '{}', pg_catalog.now())`) // a replica alive
	other := filepath.Join(a.Root, "processing", "un-other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "orders-9.csv"), []byte(goodRows("O", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	a.Drop(t, "orders-1.csv", goodRows("U", 2))
	if err := fault.Set("claim:before_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "un-a"); err == nil {
		t.Fatal("the poll went on to its claim's RENAME")
	}
	fault.Set("")
	res, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload removing a partner whose only claim is another worker's: %+v, %v", res, err)
	}
	if !stoppedDrained(t, r, "un") {
		t.Fatal("the stop did not record a drained run, with nothing of this worker left")
	}
}

// A partner removed because its site is gone goes: its last poll failed,
// and its processing dir cannot be listed (here a file stands where the
// dir should be), so nothing says whether a claim without a row is left
// there. The reload is taken, saying so, and the run is not drained: a
// start with the partner configured again looks through the dir.
func TestAReloadRemovesAPartnerWhoseDirCannotBeLookedThrough(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	a.Drop(t, "orders-1.csv", goodRows("G", 2))
	if err := fault.Set("claim:before_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "un-a"); err == nil {
		t.Fatal("the poll went on to its claim's RENAME")
	}
	fault.Set("")
	own := filepath.Join(a.Root, "processing", "un")
	if err := os.RemoveAll(own); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, []byte("not a dir"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload removing a partner whose dir cannot be listed: %+v, %v", res, err)
	}
	if stoppedDrained(t, r, "un") {
		t.Fatal("the stop recorded a drained run, though the removed partner's dir was never looked through")
	}
}

// A reload removing a partner looks for this worker's rows of it in the
// partner's claim section, where this worker's reconciler takes files
// over: a reconciler run between that look and the reload coming into
// force takes no file of the partner into this worker's hands (another
// replica serving it takes the file over). Without the guard the run
// took a gone worker's expired row over into a partner this daemon no
// longer polls.
func TestAReconcilerTakesNothingOverForAPartnerBeingRemoved(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	gone := filepath.Join(a.Root, "processing", "gone")
	if err := os.MkdirAll(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gone, "orders-1.csv"), []byte(goodRows("T", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('un-a', 'orders', 'orders-1.csv', $1, 10, 'claimed', 'gone', pg_catalog.now() - interval '1 minute') RETURNING intake_id`,
		a.Config.SFTP.Root+"/processing/gone/orders-1.csv").Scan(&id); err != nil {
		t.Fatal(err)
	}
	// the site does not answer the removal's look, so the gone worker's
	// row does not hold the removal up (goneLeft)
	if err := fault.Set("reload:in_force=pause,reload:site_probe=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	type result struct {
		res intake.ReloadResult
		err error
	}
	reloaded := make(chan result, 1)
	go func() {
		res, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
		reloaded <- result{res, err}
	}()
	select {
	case <-fault.Paused("reload:in_force"):
	case got := <-reloaded:
		t.Fatalf("the reload ended before it came into force: %+v", got)
	}
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{}, "un", 30*time.Second, namedPool(t, pool, "un"), sp, []partners.Config{a.Validated(t), b.Validated(t)},
		prometheus.NewRegistry(), testenv.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec.OnlyWhileServed(r.d.Serves)
	_, runErr := rec.RunOnce(ctx)
	rec.Stop()
	fault.Resume("reload:in_force")
	if got := <-reloaded; got.err != nil || !reflect.DeepEqual(got.res.Removed, []string{"un-a"}) {
		t.Fatalf("reload: %+v", got)
	}
	if runErr != nil {
		t.Fatal(runErr)
	}
	var worker string
	if err := pool.QueryRow(ctx, `SELECT worker_id FROM file_intake WHERE intake_id = $1`, id).Scan(&worker); err != nil {
		t.Fatal(err)
	}
	if worker != "gone" {
		t.Fatalf("the reconciler took intake %d of the partner being removed into worker %s's hands", id, worker)
	}
}

// A reload that moves a partner's processing dir (dirs.processing, or the
// root or site it lies under) while claims sit in the old one is refused,
// naming them, and the config in force is kept: a claim without a row (a
// poll failed right after its RENAME) is then adopted from the old dir by
// the next poll, and a file in flight (a live row) finishes there. Once
// nothing is left in the old dir the same reload is taken, and the next
// file is claimed into the new one. Accepting the first reload would leave
// the claim in a directory nobody looks at any more.
func TestAReloadThatMovesTheProcessingDirWaitsForItsClaims(t *testing.T) {
	_, pool := testenv.DB(t)
	a := testenv.NewSite(t, "mv-a")
	a.Config.Poll = "@every 1h" // polled by hand
	ctx := context.Background()
	r := newRig(t, pool, "mv", a)
	intake.Signals(r.d).Polled.Init(t)
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	intake.Signals(r.d).Polled.WaitOrTimeout() // the first poll, nothing there yet
	moved := a.Validated(t)
	moved.Dirs.Processing = "processing2"

	// a claim without a row in processing/mv/
	a.Drop(t, "orders-1.csv", goodRows("M", 2))
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "mv-a"); err == nil {
		t.Fatal("the poll went past its claim's RENAME")
	}
	fault.Set("")
	if got := a.Files(t, "processing"); len(got) != 1 {
		t.Fatalf("processing/ holds %v, want the claim without a row", got)
	}
	_, err := r.d.Reload(ctx, []partners.Config{moved})
	if err == nil || !strings.Contains(err.Error(), "processing/mv/orders-1.csv") || !strings.Contains(err.Error(), "no row") {
		t.Fatalf("reload moving the processing dir over a claim without a row: %v, want it refused naming the claim", err)
	}
	r.poll("mv-a") // under the config in force: adopts and archives it
	if fs := files(t, pool, "mv-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim adopted and archived", fs)
	}

	// a file in flight: its live row is named
	a.Drop(t, "orders-2.csv", goodRows("N", 2))
	resume := r.pollPaused("mv-a", "apply:mid_chunk")
	fs := files(t, pool, "mv-a")
	if len(fs) != 2 {
		t.Fatalf("rows %+v, want the second file in flight", fs)
	}
	_, err = r.d.Reload(ctx, []partners.Config{moved})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("intake %d", fs[1].ID)) {
		t.Fatalf("reload moving the processing dir under a file in flight: %v, want it refused naming intake %d", err, fs[1].ID)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	fault.Set("")
	if fs := files(t, pool, "mv-a"); len(fs) != 2 || fs[1].State != "archived" {
		t.Fatalf("rows %+v, want the second file archived", fs)
	}

	// a claim without a row already in the new dir (left by an earlier
	// run under that layout): the new runtime looks through its dir first
	left := filepath.Join(a.Root, "processing2", "mv")
	if err := os.MkdirAll(left, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "orders-4.csv"), []byte(goodRows("P", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := r.d.Reload(ctx, []partners.Config{moved})
	if err != nil || !reflect.DeepEqual(res.Changed, []string{"mv-a"}) {
		t.Fatalf("reload once the old processing dir is empty: %+v, %v", res, err)
	}
	a.Drop(t, "orders-3.csv", goodRows("O", 2))
	intake.Signals(r.d).Polled.WaitOrTimeout() // the new runtime's first poll
	r.poll("mv-a")
	for _, f := range files(t, pool, "mv-a") {
		if f.State != "archived" {
			t.Fatalf("%+v, want every file archived, the one left in the new dir included", f)
		}
	}
	if fs := files(t, pool, "mv-a"); len(fs) != 4 {
		t.Fatalf("rows %+v, want 4 files", fs)
	}
	var claimed string
	if err := pool.QueryRow(ctx, `SELECT claimed_path FROM file_intake WHERE partner_id = 'mv-a' AND remote_name = 'orders-3.csv'`).Scan(&claimed); err != nil ||
		!strings.Contains(claimed, "/processing2/mv/") {
		t.Fatalf("the next file was claimed at %q (%v), want processing2/mv/", claimed, err)
	}
}

// A reload that moves a partner's processing dir lists the old one on the
// site first; a site that leaves that listing unanswered does not hold a
// stop signal for an op timeout: the reload ends with its context, is not
// in force, and the partner's next poll (a new session) works under the
// config it had.
func TestAReloadListingAnUnansweringSiteEndsWithItsContext(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "mvhang")
	site.Config.Poll = "@every 1h" // polled by hand
	r := newRig(t, pool, "mvh", site)
	intake.Signals(r.d).Polled.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	intake.Signals(r.d).Polled.WaitOrTimeout() // the first poll, nothing there yet
	moved := site.Validated(t)
	moved.Dirs.Processing = "processing2"

	listing, release := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
		if method == "List" && strings.Contains(p, "processing") {
			select {
			case listing <- struct{}{}:
			default:
			}
			<-release
		}
		return sftpd.Entries(truth)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.d.Reload(ctx, []partners.Config{moved})
		done <- err
	}()
	select {
	case <-listing:
	case err := <-done:
		t.Fatalf("the reload ended (%v) before it listed the old processing dir", err)
	case <-time.After(time.Minute):
		t.Fatal("the reload never listed the old processing dir")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("reload: %v, want it abandoned with its context", err)
		}
	case <-time.After(30 * time.Second): // the op timeout is a minute
		t.Fatal("the reload did not end with its context while the site's listing went unanswered")
	}
	srv.Lie(nil)

	site.Drop(t, "orders-1.csv", goodRows("H", 2))
	r.poll("mvhang")
	var state, claimed string
	if err := pool.QueryRow(context.Background(), `SELECT state, claimed_path FROM file_intake WHERE partner_id = 'mvhang' AND remote_name = 'orders-1.csv'`).Scan(&state, &claimed); err != nil ||
		state != "archived" || !strings.Contains(claimed, "/processing/mvh/") {
		t.Fatalf("the next file: %s, claimed at %q (%v); want it archived, claimed under the old processing dir", state, claimed, err)
	}
}

// A reload that moves a partner's quarantine or archive dir while a hold
// or an archive has moved its file there but never recorded its end (the
// run failed right after the move, so the row stayed live) is refused,
// naming the intake, and the config in force is kept: the file's next
// attempt finds it where the move put it and finishes it there. Once no
// row is left to finish, the same reload is taken and the next file goes
// to the new dir. Taken at once, the next attempt would look for the file
// in the new dir only: a held file would be taken for lost (its row
// failed_terminal remote_lost, the file and a reason file saying it is
// held left in the old dir), an archived one archived as lost, its
// receipt saying the file vanished.
func TestAReloadThatMovesTheQuarantineOrArchiveDirWaitsForAnUnfinishedMove(t *testing.T) {
	for _, c := range []struct{ name, dir, step, state string }{
		{"quarantine", "quarantine", "hold:before_finish", "quarantined"},
		{"archive", "archive", "archive:mid", "archived"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			id := "fm-" + c.name
			site := testenv.NewSite(t, id)
			site.Config.Poll = "@every 1h" // polled by hand
			if c.name == "quarantine" {
				site.Config.Limits.MaxFileBytes = 1000 // held as it downloads
			}
			ctx := context.Background()
			r := newRigCfg(t, pool, intake.Config{WorkerID: "fm", Lease: 30 * time.Second, SpoolMinFree: 1,
				Retry: intake.RetryPolicy{Attempts: 10, Base: time.Millisecond, Max: time.Millisecond}}, site)
			intake.Signals(r.d).Polled.Init(t)
			if err := r.d.Start(ctx); err != nil {
				t.Fatal(err)
			}
			intake.Signals(r.d).Polled.WaitOrTimeout() // the first poll, nothing there yet
			moved := site.Validated(t)
			switch c.name {
			case "quarantine":
				moved.Dirs.Quarantine = "quarantine2"
			case "archive":
				moved.Dirs.Archive = "archive2"
			}

			body := testenv.OrdersCSV("F", 100)
			site.Drop(t, "orders-1.csv", body)
			if err := fault.Set(c.step + "=error"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fault.Set("") })
			if err := r.d.PollOnce(ctx, id); err == nil {
				t.Fatalf("the poll went past %s", c.step)
			}
			fault.Set("")
			fs := files(t, pool, id)
			if len(fs) != 1 || fs[0].State == c.state || len(site.Files(t, c.dir)) == 0 {
				t.Fatalf("rows %+v, %s/ %q: want a live row, its file moved to %s/", fs, c.dir, site.Files(t, c.dir), c.dir)
			}
			_, err := r.d.Reload(ctx, []partners.Config{moved})
			if !errors.Is(err, intake.ErrProcessingInUse) || !strings.Contains(err.Error(), fmt.Sprintf("intake %d", fs[0].ID)) {
				t.Errorf("reload moving %s/ under a move whose end is not recorded: %v, want it refused naming intake %d", c.dir, err, fs[0].ID)
			}

			waitDue(t, pool, id)
			r.poll(id)
			f := files(t, pool, id)[0]
			if f.State != c.state || f.Archive == "" || !strings.Contains(f.Archive, "/"+c.dir+"/") {
				t.Fatalf("%+v: want %s, the file at its path in %s/ (%s/ holds %q)", f, c.state, c.dir, c.dir, site.Files(t, c.dir))
			}
			if got := site.Read(t, site.Rel(t, f.Archive)); got != body {
				t.Fatalf("%s does not hold the file", f.Archive)
			}
			if rc := receipt(t, site, f.Receipt); rc.Detail != "" && c.name == "archive" {
				t.Fatalf("receipt %+v: want the file archived, not lost", rc)
			}

			res, err := r.d.Reload(ctx, []partners.Config{moved})
			if err != nil || !reflect.DeepEqual(res.Changed, []string{id}) {
				t.Fatalf("reload once the move is finished: %+v, %v", res, err)
			}
			intake.Signals(r.d).Polled.WaitOrTimeout() // the new runtime's first poll
			site.Drop(t, "orders-2.csv", testenv.OrdersCSV("G", 100))
			r.poll(id)
			f = files(t, pool, id)[1]
			if f.State != c.state || !strings.Contains(f.Archive, "/"+c.dir+"2/") {
				t.Fatalf("%+v: want the next file %s in %s2/", f, c.state, c.dir)
			}
		})
	}
}

// A claim a replica no longer alive left without a row (its row never
// written, the replica gone before it adopted it) holds a removal of the
// partner up while the site answers: a poller or reconciler of the
// partner adopts it, none once every replica has removed the partner.
func TestAReloadThatRemovesAPartnerWaitsForAClaimWithoutARowOfAReplicaNoLongerAlive(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	a.Drop(t, "orders-1.csv", goodRows("N", 2))
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	dead := newRig(t, pool, "dead", a)
	dead.d.PollOnce(ctx, "un-a") // fails at the fault: claimed, no row
	fault.Set("")
	dead.d.Stop() // a replica no longer alive
	if fs := files(t, pool, "un-a"); len(fs) != 0 || len(a.Files(t, "processing/dead")) != 1 {
		t.Fatalf("rows %+v and processing/dead %v, want one claim without a row", fs, a.Files(t, "processing/dead"))
	}
	_, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if !errors.Is(err, intake.ErrProcessingInUse) || !strings.Contains(err.Error(), "processing/dead/orders-1.csv (no row; its replica is no longer alive") {
		t.Fatalf("reload removing the partner: %v, want it refused naming the claim in processing/dead", err)
	}
	// adopted by the partner's reconciler and archived, the removal is
	// taken
	reconcileAs(t, pool, "un", a)
	r.d.TakenOver("un-a")
	r.poll("un-a")
	if fs := files(t, pool, "un-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim adopted and archived", fs)
	}
	res, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload removing the partner with nothing left: %+v, %v", res, err)
	}
}

// A reload that removes a partner is refused while a replica no longer
// alive holds a file of it in flight and the site answers: only a
// reconciler or a poller of the partner takes such a file over, and once
// every replica has removed the partner nobody would (its row would stay
// live for good, its gauges gone with the partner). A site that does not
// answer takes no takeover either: the partner is removed all the same,
// with a warning naming the files.
func TestAReloadThatRemovesAPartnerWaitsForFilesOfReplicasNoLongerAlive(t *testing.T) {
	_, pool := testenv.DB(t)
	r, a, b := startRemovalRig(t, pool, intake.Config{})
	ctx := context.Background()
	a.Drop(t, "orders-1.csv", goodRows("D", 2))
	if err := fault.Set("download:mid=error"); err != nil {
		t.Fatal(err)
	}
	dead := newRig(t, pool, "dead", a)
	dead.d.PollOnce(ctx, "un-a") // fails at the fault: its row stays live
	fault.Set("")
	dead.d.Stop() // a replica no longer alive
	fs := files(t, pool, "un-a")
	if len(fs) != 1 || fs[0].Worker != "dead" || fs[0].State != "claimed" {
		t.Fatalf("rows %+v, want one file in flight, held by the dead replica", fs)
	}
	_, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if !errors.Is(err, intake.ErrProcessingInUse) || !strings.Contains(err.Error(), fmt.Sprintf("intake %d (held by a replica no longer alive", fs[0].ID)) {
		t.Fatalf("reload removing the partner: %v, want it refused naming intake %d", err, fs[0].ID)
	}
	// the site does not answer: removed, said
	if err := fault.Set("reload:site_probe=error"); err != nil {
		t.Fatal(err)
	}
	defer fault.Set("")
	res, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)})
	if err != nil || !reflect.DeepEqual(res.Removed, []string{"un-a"}) {
		t.Fatalf("reload removing the partner whose site does not answer: %+v, %v", res, err)
	}
}
