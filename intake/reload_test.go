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

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
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

// A reload removes a partner whose last poll failed right after a claim's
// RENAME (a file in processing/<worker>/ without a row). The daemon's
// stop then records no drained run: the next start, with the partner
// configured again, looks through its processing dir and adopts the file.
func TestAReloadThatRemovesAnUnsettledPartnerLeavesTheRunUndrained(t *testing.T) {
	_, pool := testenv.DB(t)
	a, b := testenv.NewSite(t, "un-a"), testenv.NewSite(t, "un-b")
	for _, s := range []*testenv.Site{a, b} {
		s.Config.Poll = "@every 1h" // polled by hand
	}
	ctx := context.Background()
	r := newRig(t, pool, "un", a, b)
	intake.Signals(r.d).Polled.Init(t)
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for seen := map[string]bool{}; len(seen) < 2; { // the first polls, nothing there yet
		seen[intake.Signals(r.d).Polled.WaitOrTimeout().Partner] = true
	}
	a.Drop(t, "orders-1.csv", goodRows("U", 2))
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.PollOnce(ctx, "un-a"); err == nil {
		t.Fatal("the poll went past its claim's RENAME")
	}
	fault.Set("")
	if _, err := r.d.Reload(ctx, []partners.Config{b.Validated(t)}); err != nil {
		t.Fatal(err)
	}
	r.d.Stop()
	var drained bool
	if err := pool.QueryRow(ctx, `SELECT drained_at IS NOT NULL FROM intake_worker WHERE worker_id = 'un'`).Scan(&drained); err != nil || drained {
		t.Fatalf("the stop recorded a drained run (%v, %v) with a removed partner's claim left without a row", drained, err)
	}
	again := newRig(t, pool, "un", a, b)
	if err := again.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	again.poll("un-a")
	if fs := files(t, pool, "un-a"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the claim without a row adopted and archived", fs)
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
