package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// pausedPoll starts a poll of n with the fault step armed to pause and
// returns once it waits there; resume lets it go on and returns its error.
func pausedPoll(t *testing.T, n *node, partner, step string) (resume func() error) {
	t.Helper()
	withFault(t, step+"=pause")
	done := make(chan error, 1)
	go func() { done <- n.poll(t, partner) }()
	select {
	case <-fault.Paused(step):
	case err := <-done:
		t.Fatalf("the poll ended (%v) before %s", err, step)
	case <-time.After(30 * time.Second):
		t.Fatalf("the poll never reached %s", step)
	}
	return func() error {
		fault.Resume(step)
		return <-done
	}
}

func readReceipt(t *testing.T, site *testenv.Site, path string) sitefile.Receipt {
	t.Helper()
	var rc sitefile.Receipt
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rc); err != nil {
		t.Fatalf("receipt %s: %v", path, err)
	}
	return rc
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// stalledAndTakenOver drops a file of data on a site, has worker w1 stall
// at step while it runs it, and w2's reconciler take it over (w1's
// heartbeat may still renew the lease: expired until w2 takes it) and
// w2's poll finish it; resume lets w1 go on.
func stalledAndTakenOver(t *testing.T, data, step string) (*pgxpool.Pool, *testenv.Site, testenv.FileRow, func() error) {
	t.Helper()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "stall")
	site.Drop(t, "orders-s.csv", data)
	spoolDir := t.TempDir()
	w1 := newNode(t, pool, "w1", spoolDir, site)
	w2 := newNode(t, pool, "w2", spoolDir, site)
	resume := pausedPoll(t, w1, "stall", step)
	taken := false
	for i := 0; i < 10 && !taken; i++ {
		expireLeases(t, pool)
		taken = kinds(w2.reconcile(t))[ledger.KindLeaseExpired] == 1
	}
	if !taken {
		t.Fatal("w2 never took the stalled file over")
	}
	if err := w2.poll(t, "stall"); err != nil {
		t.Fatal(err)
	}
	return pool, site, testenv.Files(t, pool, "stall")[0], resume
}

// A worker stalled right before it publishes a receipt, whose file was
// taken over and finished by another replica meanwhile, publishes nothing
// when it wakes: its fencing check right before the write is refused, and
// the partner's receipt stays the new owner's.
func TestStalledOwnerWakingAfterATakeoverPublishesNothing(t *testing.T) {
	pool, site, f, resume := stalledAndTakenOver(t, testenv.OrdersCSV("S", 4), "publish:receipt")
	if f.State != "archived" || f.Worker != "w2" || f.Receipt == "" {
		t.Fatalf("got %+v, want archived by w2 with a receipt", f)
	}
	before, ino := site.Read(t, strings.TrimPrefix(f.Receipt, site.Root+"/")), inode(t, f.Receipt)

	err := resume()
	var fe *ledger.FencedError
	if err != nil && !errors.As(err, &fe) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the stalled owner's poll: %v", err)
	}
	if got := site.Read(t, strings.TrimPrefix(f.Receipt, site.Root+"/")); got != before || inode(t, f.Receipt) != ino {
		t.Fatal("the stalled owner rewrote the receipt after the takeover")
	}
	for _, n := range site.Files(t, "reports") {
		if n != filepath.Base(f.Receipt) {
			t.Fatalf("reports/ holds %q besides the receipt", n)
		}
	}
	if rc := readReceipt(t, site, f.Receipt); rc.Outcome != "accepted" || rc.Rows.Applied != 4 {
		t.Fatalf("receipt %+v", rc)
	}
	if got := site.Files(t, "archive"); len(got) != 1 {
		t.Fatalf("archive holds %v", got)
	}
	testenv.AssertExactOrders(t, pool, "stall", 4, "S")
}

// A worker stalled after uploading a rejects report, before its rename,
// whose file was taken over and finished meanwhile, shows nothing when it
// wakes: the upload outlasted the fence asked before it, so the rename
// is fenced again. The partner took the new owner's report away; the
// stalled one does not put it back.
func TestStalledOwnerWakingAfterItsRejectsUploadShowsNoReport(t *testing.T) {
	_, site, f, resume := stalledAndTakenOver(t, testenv.OrdersCSV("R", 4)+"R-9,c@example.com,1.00,weird,2026-11-02T10:00:00Z,1\n", "publish:rejects rename")
	if f.State != "archived" || f.Worker != "w2" || f.Rejects == "" {
		t.Fatalf("got %+v, want archived by w2 with a rejects report", f)
	}
	if err := os.Remove(f.Rejects); err != nil { // the partner took it
		t.Fatal(err)
	}
	err := resume()
	var fe *ledger.FencedError
	if err != nil && !errors.As(err, &fe) && !errors.Is(err, context.Canceled) {
		t.Fatalf("the stalled owner's poll: %v", err)
	}
	for _, n := range site.Files(t, "reports") {
		if n != filepath.Base(f.Receipt) {
			t.Fatalf("reports/ holds %q besides the receipt: the stalled owner published after the takeover", n)
		}
	}
}

// A receipt write killed between its temporary file and the rename leaves
// a hidden temporary file in reports/; the reconciler removes it once it is
// older than reconcile.stale_temp (a fresh one, of a write in progress, is
// left alone), and the file's next attempt publishes the receipt.
func TestKilledReceiptWriteLeavesNoTempBehind(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "tmp")
	site.Drop(t, "orders-t.csv", testenv.OrdersCSV("T", 3))
	w1 := newNode(t, pool, "w1", t.TempDir(), site)
	stoppedAt(t, w1, "tmp", "putfile:before_rename")
	left := site.Files(t, "reports")
	if len(left) != 1 || !sitefile.IsOurTemp(left[0]) {
		t.Fatalf("reports/ holds %v, want one temporary file", left)
	}
	stale := filepath.Join(site.Root, "reports", left[0])
	fresh := filepath.Join(site.Root, "quarantine", ".7.orders-x.csv.reason.json.0123456789abcdef.tmp")
	if err := os.WriteFile(fresh, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fs := w1.reconcile(t); kinds(fs)[ledger.KindStaleRemoteTemp] != 0 {
		t.Fatalf("a fresh temporary file was removed: %+v", fs)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	fs := w1.reconcile(t)
	if kinds(fs)[ledger.KindStaleRemoteTemp] != 1 {
		t.Fatalf("findings %+v, want one stale_remote_temp", fs)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale temporary file is still there: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("the fresh temporary file: %v", err)
	}
	if err := w1.poll(t, "tmp"); err != nil {
		t.Fatal(err)
	}
	f := testenv.Files(t, pool, "tmp")[0]
	if rc := readReceipt(t, site, f.Receipt); f.State != "archived" || rc.Outcome != "accepted" {
		t.Fatalf("%+v, receipt %+v", f, rc)
	}
}

// Discards ops recorded that never reached the site: a run publishes
// each, and one whose publication fails (a fault stands in for a site
// refusing its receipt) is an error of the run, tried again at the next,
// while the partner's other discard is published in the same run.
func TestADiscardThatFailsToPublishHoldsNoOtherBack(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "disc")
	site.Config.Limits.MaxFileBytes = 64
	site.Drop(t, "orders-a.csv", testenv.OrdersCSV("A", 20))
	site.Drop(t, "orders-b.csv", testenv.OrdersCSV("B", 20))
	n := newNode(t, pool, "w1", t.TempDir(), site)
	if err := n.poll(t, "disc"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held := testenv.Files(t, pool, "disc")
	if len(held) != 2 {
		t.Fatalf("%+v: want two files held", held)
	}
	for _, f := range held {
		if f.State != "quarantined" {
			t.Fatalf("%+v: want quarantined", f)
		}
		if err := ops.Discard(ctx, pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "too large", Partners: []string{"disc"},
			Worker: intake.OpsWorker("ops")}); err != nil {
			t.Fatal(err)
		}
	}
	withFault(t, "reconcile:publish_discard=error")
	fs, err := n.rec.RunOnce(ctx)
	if !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("the run's error %v, want the failed publication's", err)
	}
	if got := kinds(fs)[ledger.KindDecisionPublished]; got != 1 {
		t.Fatalf("%d discards published beside the one that failed, want 1", got)
	}
	if got := kinds(n.reconcile(t))[ledger.KindDecisionPublished]; got != 1 {
		t.Fatalf("the next run published %d, want the one left", got)
	}
	for _, f := range testenv.Files(t, pool, "disc") {
		if rc := readReceipt(t, site, f.Receipt); f.State != "discarded" || rc.Outcome != ledger.OutcomeDiscarded {
			t.Fatalf("%+v, receipt %+v: want discarded, and its receipt says so", f, rc)
		}
	}
	for _, name := range site.Files(t, "quarantine") {
		if strings.HasSuffix(name, sitefile.ReasonSuffix) {
			t.Fatalf("quarantine/ still holds the reason file %s of a discarded file", name)
		}
	}
}
