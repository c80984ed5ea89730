package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/leaderlock"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A partner's file names are text the partner chooses: an abandoned
// upload in incoming/ whose name is not UTF-8 (PostgreSQL's text cannot
// hold it) is stored in its printable form, one whose name holds a
// terminal's escape sequence as it is (`intake status` escapes it), and
// the run stores every partner's findings, another partner's
// host_key_mismatch among them (and its notification).
func TestFindingsOfHostileNamesAreStoredPrintableBesideOtherPartners(t *testing.T) {
	_, pool := testenv.DB(t)
	bad := testenv.NewSite(t, "hn-bad")
	old := time.Now().Add(-7 * time.Hour)
	for _, name := range []string{"bad\xff.part", "esc\x1b[2K.part"} {
		p := filepath.Join(bad.Root, "incoming", name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	hk := testenv.NewSite(t, "hn-hk")
	other, err := sshdtest.WriteKey(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(t.TempDir(), "kh")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{hk.Config.SFTP.Address}, other)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hk.Config.SFTP.KnownHostsFile = kh

	w := newNode(t, pool, "w1", t.TempDir(), bad, hk)
	fs := w.reconcile(t) // fails the test if the findings are not stored
	if k := kinds(fs); k[ledger.KindStaleUpload] != 2 || k[ledger.KindHostKeyMismatch] != 1 {
		t.Fatalf("findings %+v, want two stale uploads and a host key mismatch", fs)
	}
	stored, err := ledger.StoredFindings(context.Background(), pool, []string{"hn-bad", "hn-hk"})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	mismatch := 0
	for _, f := range stored {
		switch {
		case f.Partner == "hn-bad" && f.Kind == ledger.KindStaleUpload:
			paths = append(paths, f.Path)
		case f.Partner == "hn-hk" && f.Kind == ledger.KindHostKeyMismatch:
			mismatch++
		}
	}
	if mismatch != 1 {
		t.Fatalf("stored findings %+v: no host_key_mismatch of hn-hk", stored)
	}
	want := []string{bad.Root + `/incoming/bad\xff.part`, bad.Root + "/incoming/esc\x1b[2K.part"}
	sort.Strings(paths)
	if strings.Join(paths, "|") != strings.Join(want, "|") {
		t.Fatalf("stored stale uploads %q, want %q", paths, want)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_reconcile_run WHERE partner_id IN ('hn-bad', 'hn-hk')`); n != 2 {
		t.Fatalf("%d partners' runs recorded, want 2", n)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox WHERE partner_id = 'hn-hk' AND event = 'host_key_mismatch'`); n != 1 {
		t.Fatalf("%d host_key_mismatch events, want 1", n)
	}
}

// A partner whose findings cannot be stored keeps its last run's, with
// that run's time, and the other partners' findings of the run are
// stored all the same.
func TestAPartnersFindingsThatCannotBeStoredCostNoOtherPartnerTheirs(t *testing.T) {
	_, pool := testenv.DB(t)
	a, b := testenv.NewSite(t, "st-a"), testenv.NewSite(t, "st-b")
	old := time.Now().Add(-7 * time.Hour)
	upload := func(s *testenv.Site, name string) {
		t.Helper()
		p := filepath.Join(s.Root, "incoming", name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	stored := func(partner string) int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_finding WHERE partner_id = $1 AND kind = 'stale_upload'`, partner)
	}
	runAt := func(partner string) time.Time {
		var at time.Time
		if err := pool.QueryRow(context.Background(), `SELECT run_at FROM intake_reconcile_run WHERE partner_id = $1`, partner).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	upload(a, "a-1.csv.part")
	upload(b, "b-1.csv.part")
	w := newNode(t, pool, "w1", t.TempDir(), a, b)
	w.reconcile(t)
	if stored("st-a") != 1 || stored("st-b") != 1 {
		t.Fatalf("stored stale uploads a %d, b %d after the first run, want 1 and 1", stored("st-a"), stored("st-b"))
	}
	first := runAt("st-a")

	upload(a, "a-2.csv.part")
	upload(b, "b-2.csv.part")
	withFault(t, "reconcile:store=error") // the first partner's store, st-a's
	_, err := w.rec.RunOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "store findings of partner st-a") {
		t.Fatalf("run: %v, want st-a's findings not stored", err)
	}
	if stored("st-a") != 1 || !runAt("st-a").Equal(first) {
		t.Fatalf("st-a holds %d stale uploads of the run at %s, want its first run's 1 at %s", stored("st-a"), runAt("st-a"), first)
	}
	if stored("st-b") != 2 || !runAt("st-b").After(first) {
		t.Fatalf("st-b holds %d stale uploads of the run at %s, want this run's 2", stored("st-b"), runAt("st-b"))
	}
}

// A site with thousands of entries of one kind (abandoned uploads in
// incoming/, hostile entries left in ready/) costs a run the first 100
// findings of each kind and one that counts the rest, kept so while the
// listing runs (a ready/ of millions of entries is never held whole): of
// the entries left in ready/, the oldest, as the poller claims them.
func TestFindingsOfOneKindAreBoundedPerRun(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "many")
	const n = 250
	now := time.Now() // one clock for all: a stall between two files must not reorder them
	for i := range n {
		// ready/'s newest first in name order: the oldest kept are the
		// last names
		for _, p := range []string{filepath.Join(site.Root, "incoming", fmt.Sprintf("f%04d.part", i)),
			filepath.Join(site.Root, "ready", fmt.Sprintf("x%04d.pdf", i))} {
			old := now.Add(-7*time.Hour - time.Duration(i)*time.Second)
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	w := newNode(t, pool, "w1", t.TempDir(), site)
	fs := w.reconcile(t)
	for _, kind := range []string{ledger.KindStaleUpload, ledger.KindUnclaimableReady} {
		var listed []string
		summary := 0
		for _, f := range fs {
			if f.Kind != kind {
				continue
			}
			if f.Path != "" {
				listed = append(listed, filepath.Base(f.Path))
			} else if strings.Contains(f.Detail, fmt.Sprintf("%d more findings", n-100)) && f.NeedsHuman {
				summary++
			}
		}
		if len(listed) != 100 || summary != 1 {
			t.Fatalf("%s: %d listed and %d summaries, want 100 and one counting the other %d", kind, len(listed), summary, n-100)
		}
		if kind == ledger.KindUnclaimableReady {
			for k, name := range listed { // oldest first
				if want := fmt.Sprintf("x%04d.pdf", n-1-k); name != want {
					t.Fatalf("entry %d listed %s, want %s: the oldest, oldest first", k, name, want)
				}
			}
		}
	}
}

// A reconciler whose leadership ended during its run (its lock's session
// ended: the replica paused past the server's timeouts; another may lead
// now) stores none of its findings: they would replace a newer leader's,
// and notify again a host key mismatch that leader found over.
func TestAReconcilerThatLostItsLockStoresNoFindings(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "lost")
	site.Drop(t, "orders-l.csv", testenv.OrdersCSV("L", 2))
	n := newNode(t, pool, "w1", t.TempDir(), site)
	if err := n.poll(t, "lost"); err != nil {
		t.Fatal(err)
	}
	const step = "reconcile:remote_temps_listed" // after its lock, before its findings are stored
	withFault(t, step+"=pause")
	t.Cleanup(func() { fault.Resume(step) })
	done := make(chan error, 1)
	go func() {
		_, err := n.rec.RunOnce(t.Context())
		done <- err
	}()
	select {
	case <-fault.Paused(step):
	case err := <-done:
		t.Fatalf("the run ended (%v) before %s", err, step)
	case <-time.After(30 * time.Second):
		t.Fatalf("the run never reached %s", step)
	}
	var holder int32
	if err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_catalog.pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND classid = ((pg_catalog.hashtextextended('partner-intake/reconcile', 0) >> 32) & 4294967295)::oid
		  AND objid = (pg_catalog.hashtextextended('partner-intake/reconcile', 0) & 4294967295)::oid`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `SELECT pg_catalog.pg_terminate_backend($1)`, holder); err != nil {
		t.Fatal(err)
	}
	// the signal is asynchronous: the run goes on once the session has ended
	testenv.WaitFor(t, 30*time.Second, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1`, holder) == 0
	}, testenv.Says("the lock's session ends"))
	fault.Resume(step)
	if err := <-done; !errors.Is(err, leaderlock.ErrLost) {
		t.Fatalf("the run ended with %v, want its lock lost", err)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_reconcile_run WHERE partner_id = 'lost'`); n != 0 {
		t.Fatalf("%d runs stored, want none of the run whose lock was lost", n)
	}
	if _, err := n.rec.RunOnce(t.Context()); err != nil {
		t.Fatalf("the next run: %v", err)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_reconcile_run WHERE partner_id = 'lost'`); n != 1 {
		t.Fatalf("%d runs stored after the next run, want its own", n)
	}
}
