package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// readOnlySite is a partner on a real OpenSSH account that may list and
// read but not write, rename or delete (internal-sftp -R), under claim:
// record.
func readOnlySite(t *testing.T) *testenv.Site {
	t.Helper()
	srv, err := sshdtest.StartSFTP("-R")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root, err := srv.PartnerRoot("readonly")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "ready"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := partners.Config{ID: "ro",
		SFTP: partners.SFTP{Address: srv.Addr, User: srv.User, PrivateKeyFile: srv.ClientKeyFile,
			KnownHostsFile: srv.KnownHostsFile, Root: root, DialTimeout: 10 * time.Second},
		Readiness: partners.ReadinessStable, Claim: partners.ClaimRecord,
		Stable: partners.Stable{StableFor: time.Second, MinAge: time.Millisecond},
		Feeds:  []partners.Feed{testenv.OrdersFeed()}}
	return &testenv.Site{Root: root, Config: c}
}

func siteTree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// claim: record on a read-only account: each file is taken once (by
// name, size and mtime), across polls, a daemon restart and two replicas
// racing; nothing on the site is moved or written; a file changed under
// the same name is a new intake, judged by the batch rules.
func TestRecordClaimsOnAReadOnlySite(t *testing.T) {
	_, pool := testenv.DB(t)
	site := readOnlySite(t)
	cfg := func(w string) intake.Config {
		return intake.Config{WorkerID: w, Lease: 30 * time.Second, SpoolMinFree: 1, Affinity: intake.AffinityNone}
	}
	contents := map[string]string{}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("orders-2026120%d.csv", i)
		contents[name] = goodRows(fmt.Sprintf("RO%d", i), 3)
		if err := os.WriteFile(filepath.Join(site.Root, "ready", name), []byte(contents[name]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := siteTree(t, site.Root)
	a := newRigCfg(t, pool, cfg("a"), site)
	a.poll("ro")
	if fs := files(t, pool, "ro"); len(fs) != 0 {
		t.Fatalf("taken at first sight: %+v", fs)
	}
	for name := range contents {
		waitStable(t, pool, "ro", name, time.Second)
	}
	a.poll("ro")
	fs := files(t, pool, "ro")
	if len(fs) != 3 {
		t.Fatalf("got %+v, want 3 intakes", fs)
	}
	for _, f := range fs {
		if f.State != "archived" || f.Applied != 3 || f.Archive != "" || f.Receipt != "" {
			t.Fatalf("got %+v, want archived with 3 rows and nothing written on the site", f)
		}
	}
	testenv.AssertExactOrders(t, pool, "ro", 3, "RO1", "RO2", "RO3")
	if after := siteTree(t, site.Root); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("the site changed: %v, was %v", after, before)
	}
	// taken once: more polls, a restart, and a second replica take nothing
	a.poll("ro")
	a.d.Stop()
	a2 := newRigCfg(t, pool, cfg("a"), site)
	a2.poll("ro")
	b := newRigCfg(t, pool, cfg("b"), site)
	b.poll("ro")
	if fs := files(t, pool, "ro"); len(fs) != 3 {
		t.Fatalf("got %d intakes after more polls, a restart and a second replica, want 3: %+v", len(fs), fs)
	}

	// two replicas racing for a new file: one claim
	name := "orders-20261204.csv"
	if err := os.WriteFile(filepath.Join(site.Root, "ready", name), []byte(goodRows("RO4", 4)), 0o644); err != nil {
		t.Fatal(err)
	}
	a2.poll("ro")
	waitStable(t, pool, "ro", name, time.Second)
	var wg sync.WaitGroup
	for _, r := range []*rig{a2, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.d.PollOnce(context.Background(), "ro"); err != nil {
				t.Errorf("poll: %v", err)
			}
		}()
	}
	wg.Wait()
	fs = files(t, pool, "ro")
	if len(fs) != 4 || fs[3].Name != name || fs[3].State != "archived" || fs[3].Applied != 4 {
		t.Fatalf("got %+v, want the new file taken once", fs)
	}

	// a changed file under a taken name: a new intake, and the batch rules
	// hold it (same batch, other bytes)
	changed := "orders-20261201.csv"
	p := filepath.Join(site.Root, "ready", changed)
	if err := os.WriteFile(p, []byte(goodRows("RX", 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	b.poll("ro")
	waitStable(t, pool, "ro", changed, time.Second)
	b.poll("ro")
	fs = files(t, pool, "ro")
	if len(fs) != 5 || fs[4].Name != changed || fs[4].State != "quarantined" || fs[4].Reason != "batch_conflict" {
		t.Fatalf("got %+v, want the changed file held as batch_conflict", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ro'`); n != 3*3+4 {
		t.Fatalf("%d target rows, want 13 (three files of 3, one of 4)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ro' AND order_id LIKE 'RX-%'`); n != 0 {
		t.Fatalf("%d rows of the held file applied", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_record_claim WHERE partner_id = 'ro'`); n != 5 {
		t.Fatalf("%d claim records, want 5", n)
	}

	// a hostile entry (no feed matches) is held once, as a record, unread
	if err := os.WriteFile(filepath.Join(site.Root, "ready", "invoice.pdf"), []byte("%PDF"), 0o644); err != nil {
		t.Fatal(err)
	}
	a2.poll("ro")
	b.poll("ro")
	a2.poll("ro")
	fs = files(t, pool, "ro")
	if len(fs) != 6 || fs[5].Name != "invoice.pdf" || fs[5].State != "quarantined" || fs[5].Reason != "no_feed" || fs[5].Archive != "" {
		t.Fatalf("got %+v, want the hostile entry held once as no_feed", fs)
	}
	for _, e := range siteTree(t, site.Root) {
		if e != "ready" && e != "ready/invoice.pdf" && !strings.HasPrefix(e, "ready/orders-2026120") {
			t.Fatalf("the site holds %s: nothing may be written on a read-only site", e)
		}
	}

	// bounded: a claim whose file no listing saw for 7 days is forgotten;
	// one still listed is renewed by the listing and kept
	if _, err := pool.Exec(context.Background(), `UPDATE intake_record_claim SET last_seen = now() - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(site.Root, "ready", "orders-20261202.csv")); err != nil {
		t.Fatal(err)
	}
	b.poll("ro")
	var left []string
	rs, err := pool.Query(context.Background(), `SELECT name FROM intake_record_claim WHERE partner_id = 'ro' AND last_seen > now() - interval '1 hour' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var n string
		rs.Scan(&n)
		left = append(left, n)
	}
	rs.Close()
	// forgotten: orders-20261202.csv (deleted) and the first version of
	// orders-20261201.csv (replaced: its name, size and mtime are listed no more)
	want := []string{"invoice.pdf", "orders-20261201.csv", "orders-20261203.csv", "orders-20261204.csv"}
	if strings.Join(left, ",") != strings.Join(want, ",") {
		t.Fatalf("claims renewed %v, want %v", left, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_record_claim WHERE partner_id = 'ro'`); n != int64(len(want)) {
		t.Fatalf("%d claims, want %d: the gone file's claim is forgotten", n, len(want))
	}
	if fs := files(t, pool, "ro"); len(fs) != 6 {
		t.Fatalf("%d intakes after the forgetting poll, want 6", len(fs))
	}
}

// claim: record: a file written to after its claim (the partner still
// uploading) is not applied; its claim is dropped, and the next stable
// listing takes the whole file.
func TestRecordClaimOfAFileChangedAfterTheClaimIsDropped(t *testing.T) {
	_, pool := testenv.DB(t)
	site := readOnlySite(t)
	r := newRig(t, pool, "w1", site)
	head, rows := rowsOf(goodRows("RC", 6))
	name := "orders-20261205.csv"
	p := filepath.Join(site.Root, "ready", name)
	appendTo(t, p, head+strings.Join(rows[:3], ""))
	r.poll("ro")
	waitStable(t, pool, "ro", name, time.Second)
	resume := r.pollPaused("ro", "download:mid")
	appendTo(t, p, strings.Join(rows[3:], ""))
	if err := resume(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	fs := files(t, pool, "ro")
	if len(fs) != 1 || fs[0].State != "put_back" || fs[0].Reason != "changed_after_claim" {
		t.Fatalf("got %+v, want the claim put back", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_record_claim WHERE partner_id = 'ro'`); n != 0 {
		t.Fatalf("%d claim records left after the put back, want 0", n)
	}
	r.poll("ro")
	waitStable(t, pool, "ro", name, time.Second)
	r.poll("ro")
	fs = files(t, pool, "ro")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Applied != 6 {
		t.Fatalf("got %+v, want the whole file taken under a second intake", fs)
	}
	testenv.AssertExactOrders(t, pool, "ro", 6, "RC")
}
