package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Readiness stable: partners who cannot rename write straight into
// ready/ (stable.go, partners/ready.go ClassifyStable).

func stableSite(t *testing.T, stableFor time.Duration) *testenv.Site {
	t.Helper()
	site := testenv.NewSite(t, "acme")
	site.Config.Readiness = partners.ReadinessStable
	site.Config.Stable = partners.Stable{StableFor: stableFor, MinAge: time.Millisecond}
	return site
}

// waitStable is testenv.WaitStable.
func waitStable(t *testing.T, pool *pgxpool.Pool, partner, name string, d time.Duration) {
	t.Helper()
	testenv.WaitStable(t, pool, partner, name, d)
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// rowsOf splits an OrdersCSV into its header and its row lines.
func rowsOf(csv string) (string, []string) {
	lines := strings.SplitAfter(csv, "\n")
	return lines[0], lines[1 : len(lines)-1]
}

// A slow uploader writes into ready/ with pauses; whatever the pauses,
// every poll that comes after a write leaves the file alone (the write
// restarts its clock), and names an upload tool writes under (*.tmp, ~*)
// are never taken. Once the writes stop, the file is taken whole.
func TestStableReadinessNeverTakesAFileStillBeingWritten(t *testing.T) {
	_, pool := testenv.DB(t)
	site := stableSite(t, time.Second)
	r := newRig(t, pool, "w1", site)

	head, rows := rowsOf(goodRows("S", 12))
	name := "orders-20261110.csv"
	ready := filepath.Join(site.Root, "ready", name)
	appendTo(t, ready, head)
	for _, tmp := range []string{"orders-20261111.csv.tmp", "~orders-20261112.csv", "orders-20261113.csv.filepart"} {
		appendTo(t, filepath.Join(site.Root, "ready", tmp), goodRows("T", 2))
		old := time.Now().Add(-time.Hour)
		if err := os.Chtimes(filepath.Join(site.Root, "ready", tmp), old, old); err != nil {
			t.Fatal(err)
		}
	}
	for i, row := range rows {
		appendTo(t, ready, row)
		r.poll("acme")
		if fs := files(t, pool, "acme"); len(fs) != 0 {
			t.Fatalf("after write %d the poll took %+v; a file written since the last listing is never ready", i+1, fs)
		}
		if got := site.Read(t, filepath.Join("ready", name)); got != head+strings.Join(rows[:i+1], "") {
			t.Fatalf("after write %d ready/%s holds %d bytes, want what was written", i+1, name, len(got))
		}
	}
	// the uploader stops: the file is taken once stable_for has passed
	waitStable(t, pool, "acme", name, time.Second)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].Name != name || fs[0].State != "archived" || fs[0].Applied != int64(len(rows)) {
		t.Fatalf("got %+v, want %s archived with %d rows", fs, name, len(rows))
	}
	testenv.AssertExactOrders(t, pool, "acme", len(rows), "S")
	left := site.Files(t, "ready")
	sort.Strings(left)
	want := []string{"orders-20261111.csv.tmp", "orders-20261113.csv.filepart", "~orders-20261112.csv"}
	if strings.Join(left, ",") != strings.Join(want, ",") {
		t.Fatalf("ready/ holds %v, want the ignored names %v untouched", left, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_ready_seen WHERE partner_id = 'acme'`); n != 0 {
		t.Fatalf("%d stability records left, want none: ignored names are not remembered, taken ones are forgotten", n)
	}
}

// The uploader still holds the file open when it is claimed and writes on
// into the claimed file: when the download ends the size differs from the
// listing, and the file goes back to ready/ unapplied; once the writes
// stop it is taken whole, under a new intake.
//
// Interrupted after the row ends put_back and before the rename back (as
// a crash there), the next poll finishes the put back instead of adopting
// the file as a claim. A rename back that fails (here ready/ is not a
// directory for a moment) ends neither the file nor the poll: the next
// poll looks through processing/ again and puts the file back. Found by
// another worker's reconciler (the claimer gone), the put back is
// finished there too.
func TestStableFileChangedAfterTheClaimIsPutBack(t *testing.T) {
	t.Run("put back", func(t *testing.T) { testPutBack(t, "") })
	t.Run("interrupted before the rename back", func(t *testing.T) { testPutBack(t, "interrupted") })
	t.Run("interrupted, then found by another worker's reconciler", func(t *testing.T) { testPutBack(t, "reconciled") })
	t.Run("the rename back fails", func(t *testing.T) { testPutBack(t, "refused") })
	t.Run("a new file of that name already in ready", testReplacedBeforePutBack)
}

func testPutBack(t *testing.T, mode string) {
	interrupted := mode == "interrupted" || mode == "reconciled"
	_, pool := testenv.DB(t)
	site := stableSite(t, time.Second)
	r := newRig(t, pool, "w1", site)

	head, rows := rowsOf(goodRows("P", 8))
	name := "orders-20261114.csv"
	ready := filepath.Join(site.Root, "ready", name)
	f, err := os.OpenFile(ready, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(head + strings.Join(rows[:5], "")); err != nil {
		t.Fatal(err)
	}
	r.poll("acme") // first seen
	if fs := files(t, pool, "acme"); len(fs) != 0 {
		t.Fatalf("first listing took %+v", fs)
	}
	waitStable(t, pool, "acme", name, time.Second)
	spec := "download:mid=pause"
	if interrupted {
		spec += ",putback:after_mark=error"
	}
	if err := fault.Set(spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	done := make(chan error, 1)
	go func() { done <- r.d.PollOnce(context.Background(), "acme") }()
	select {
	case <-fault.Paused("download:mid"):
	case <-time.After(30 * time.Second):
		t.Fatal("the file was never claimed")
	}
	// claimed: the uploader's open file is now processing/w1/<name>
	if _, err := os.Stat(filepath.Join(site.Root, "processing", "w1", name)); err != nil {
		t.Fatalf("the file is not claimed: %v", err)
	}
	if _, err := f.WriteString(strings.Join(rows[5:], "")); err != nil {
		t.Fatal(err)
	}
	readyDir := filepath.Join(site.Root, "ready")
	if mode == "refused" {
		if err := os.Rename(readyDir, readyDir+".away"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(readyDir, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fault.Resume("download:mid")
	if err := <-done; interrupted != (err != nil) {
		t.Fatalf("poll: %v", err)
	}
	if mode == "refused" {
		if _, err := os.Stat(filepath.Join(site.Root, "processing", "w1", name)); err != nil {
			t.Fatalf("a refused put back should leave the file claimed: %v", err)
		}
		if err := os.Remove(readyDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(readyDir+".away", readyDir); err != nil {
			t.Fatal(err)
		}
		r.poll("acme") // looks through processing/ again: puts it back
	}
	if interrupted {
		if _, err := os.Stat(filepath.Join(site.Root, "processing", "w1", name)); err != nil {
			t.Fatalf("the interrupted put back should leave the file claimed: %v", err)
		}
		fault.Set("")
		if mode == "reconciled" {
			r.reconcileAs("w2", site) // w1 is gone: finishes the put back, adopts nothing
		} else {
			r.poll("acme") // finishes the put back (resumeOwn)
		}
	}
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "put_back" || fs[0].Reason != "changed_after_claim" {
		t.Fatalf("got %+v, want one intake put_back (changed_after_claim)", fs)
	}
	if n := testutil.ToFloat64(r.d.Metrics().PutBack.WithLabelValues("acme")); n != 1 {
		t.Fatalf("intake_put_back_total %v, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 0 {
		t.Fatalf("%d rows applied from a file that changed after its claim, want none", n)
	}
	if got := site.Read(t, filepath.Join("ready", name)); got != head+strings.Join(rows, "") {
		t.Fatalf("ready/%s holds %d bytes after the put back, want all %d written", name, len(got), len(head+strings.Join(rows, "")))
	}
	if left := site.Files(t, filepath.Join("processing", "w1")); len(left) != 0 {
		t.Fatalf("processing/w1 holds %v after the put back", left)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// the writes stopped: the next stable listing takes it whole
	r.poll("acme") // sees it again, its clock starts afresh
	if fs := files(t, pool, "acme"); len(fs) != 1 {
		t.Fatalf("a put-back file was taken again at once: %+v", fs)
	}
	waitStable(t, pool, "acme", name, time.Second)
	r.poll("acme")
	fs = files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Applied != int64(len(rows)) || fs[1].ID <= fs[0].ID {
		t.Fatalf("got %+v, want a second intake archived with %d rows", fs, len(rows))
	}
	testenv.AssertExactOrders(t, pool, "acme", len(rows), "P")
}

// The partner wrote a new file under the name into ready/ while the
// claimed one was still written to: the claimed copy cannot go back (RENAME
// never overwrites), so it is held in quarantine/ with the reason; the new
// file is left alone and taken once stable.
func testReplacedBeforePutBack(t *testing.T) {
	_, pool := testenv.DB(t)
	site := stableSite(t, time.Second)
	r := newRig(t, pool, "w1", site)
	head, rows := rowsOf(goodRows("P", 8))
	name := "orders-20261116.csv"
	ready := filepath.Join(site.Root, "ready", name)
	f, err := os.OpenFile(ready, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(head + strings.Join(rows[:5], "")); err != nil {
		t.Fatal(err)
	}
	r.poll("acme")
	waitStable(t, pool, "acme", name, time.Second)
	resume := r.pollPaused("acme", "download:mid")
	if _, err := f.WriteString(strings.Join(rows[5:], "")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fresh := goodRows("Q", 3)
	appendTo(t, ready, fresh) // a new file: the old name was free since the claim
	if err := resume(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != "changed_after_claim" {
		t.Fatalf("got %+v, want the claimed copy held (changed_after_claim)", fs)
	}
	if got := site.Read(t, filepath.Join("ready", name)); got != fresh {
		t.Fatalf("the new file in ready/ was touched: %d bytes", len(got))
	}
	held := site.Files(t, "quarantine")
	sort.Strings(held)
	if len(held) != 2 || site.Read(t, filepath.Join("quarantine", held[0])) != head+strings.Join(rows, "") {
		t.Fatalf("quarantine/ holds %v, want the claimed copy and its reason file", held)
	}
	r.poll("acme") // first sight of the new file
	if fs := files(t, pool, "acme"); len(fs) != 1 {
		t.Fatalf("the new file was taken at first sight: %+v", fs)
	}
	waitStable(t, pool, "acme", name, time.Second)
	r.poll("acme")
	fs = files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Applied != 3 {
		t.Fatalf("got %+v, want the new file archived with 3 rows", fs)
	}
	testenv.AssertExactOrders(t, pool, "acme", 3, "Q")
}

// The clock lives in PostgreSQL: a daemon that starts after another one
// saw the file (a restart, or another replica) does not start it again.
// Its first poll takes a file the earlier daemon saw stable_for ago.
func TestStableClockSurvivesARestart(t *testing.T) {
	_, pool := testenv.DB(t)
	stableFor := 2 * time.Second
	site := stableSite(t, stableFor)
	name := "orders-20261115.csv"
	appendTo(t, filepath.Join(site.Root, "ready", name), goodRows("R", 4))

	first := newRig(t, pool, "w1", site)
	first.poll("acme")
	var since time.Time
	if err := pool.QueryRow(context.Background(), `SELECT first_seen_unchanged FROM intake_ready_seen
		WHERE partner_id = 'acme' AND name = $1`, name).Scan(&since); err != nil {
		t.Fatalf("the first daemon did not remember the file: %v", err)
	}
	if fs := files(t, pool, "acme"); len(fs) != 0 {
		t.Fatalf("taken at first sight: %+v", fs)
	}
	first.d.Stop()

	waitStable(t, pool, "acme", name, stableFor)
	second := newRig(t, pool, "w1", site)
	second.poll("acme") // its very first listing
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 4 {
		t.Fatalf("got %+v: the restarted daemon's first poll should take the file the earlier one saw stable_for ago", fs)
	}
	testenv.AssertExactOrders(t, pool, "acme", 4, "R")
}

// A directory of many names never grows the stability table past what a
// listing keeps (max_files_per_poll, the oldest); names that leave ready/
// are forgotten.
func TestStableRecordsAreBounded(t *testing.T) {
	_, pool := testenv.DB(t)
	site := stableSite(t, time.Hour)
	site.Config.Limits.MaxFilesPerPoll = 10
	r := newRig(t, pool, "w1", site)
	base := time.Now().Add(-24 * time.Hour)
	var names []string
	for i := 0; i < 120; i++ {
		name := fmt.Sprintf("orders-b%03d.csv", i)
		p := filepath.Join(site.Root, "ready", name)
		appendTo(t, p, goodRows(fmt.Sprintf("B%d", i), 1))
		mt := base.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	remembered := func() []string {
		rs, err := pool.Query(context.Background(), `SELECT name FROM intake_ready_seen WHERE partner_id = 'acme' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		var out []string
		for rs.Next() {
			var n string
			if err := rs.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	r.poll("acme")
	if got, want := remembered(), names[:10]; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("remembered %v, want the 10 oldest %v", got, want)
	}
	for _, n := range names[:4] {
		if err := os.Remove(filepath.Join(site.Root, "ready", n)); err != nil {
			t.Fatal(err)
		}
	}
	r.poll("acme")
	if got, want := remembered(), names[4:14]; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("remembered %v, want the 10 oldest left %v (vanished names forgotten)", got, want)
	}
	if fs := files(t, pool, "acme"); len(fs) != 0 {
		t.Fatalf("took %+v before stable_for", fs)
	}
}

// The uploader writes on into the claimed file after the download ended
// (its handle follows the RENAME): right before the file's last commit
// the claimed file is looked at again, and a file that grew is not
// committed as complete: held changed_after_claim, nothing of it applied
// (one chunk), its receipt telling the partner.
func TestStableFileThatGrowsBeforeItsLastCommitIsHeld(t *testing.T) {
	_, pool := testenv.DB(t)
	site := stableSite(t, time.Second)
	r := newRig(t, pool, "w1", site)
	name := "orders-20261115.csv"
	site.Drop(t, name, goodRows("G", 4))
	r.poll("acme") // first seen
	waitStable(t, pool, "acme", name, time.Second)
	resume := r.pollPaused("acme", "apply:before_last_commit")
	claimed := filepath.Join(site.Root, "processing", "w1", name)
	f, err := os.OpenFile(claimed, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("the file is not claimed: %v", err)
	}
	if _, err := f.WriteString(ordersLine("G", 5, "")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := resume(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != "changed_after_claim" || fs[0].Applied != 0 {
		t.Fatalf("got %+v, want the file held changed_after_claim with nothing applied", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 0 {
		t.Fatalf("%d rows applied from a file that grew before its commit", n)
	}
	if rc := receipt(t, site, fs[0].Receipt); rc.Outcome != "quarantined" || rc.Reason != "changed_after_claim" {
		t.Fatalf("receipt %+v, want quarantined changed_after_claim", rc)
	}
}

// Servers that keep modification times of their own: an object store's
// gateway stamps an upload's start (every listing while the file grows
// shows that time, older than intake's first sighting of the file) and
// stamps it again when the upload is committed (a jump with the size
// unchanged); others keep whole hours, minutes or seconds. Readiness
// stable measures the quiet period on intake's clock from the listing
// that first saw the size and mtime as they are, never from the mtime: a
// file that grows between listings a quiet period apart is never
// claimed, whatever its mtime says; a stamp that jumps starts the clock
// again; once size and mtime stay the same for stable_for, the file is
// taken whole.
func TestStableReadinessOnAServerThatStampsItsOwnMTimes(t *testing.T) {
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	for _, tc := range []struct {
		name  string
		stamp func(time.Time) time.Time
	}{
		{"stamped at the upload's start", func(time.Time) time.Time { return start }},
		{"whole hours", func(t time.Time) time.Time { return t.Truncate(time.Hour) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			srv, site := testenv.NewInProcessSite(t, "acme")
			site.Config.Readiness = partners.ReadinessStable
			site.Config.Stable = partners.Stable{StableFor: time.Second, MinAge: time.Millisecond}
			srv.StampMTimes(tc.stamp)
			r := newRig(t, pool, "w1", site)

			head, rows := rowsOf(goodRows("S", 4))
			name := "orders-20261204.csv"
			ready := filepath.Join(site.Root, "ready", name)
			appendTo(t, ready, head)
			r.poll("acme") // the first sighting
			if fs := files(t, pool, "acme"); len(fs) != 0 {
				t.Fatalf("the first listing that saw the file took %+v; its mtime, an hour old, says nothing of how long it has been quiet", fs)
			}
			for i, row := range rows {
				// a quiet period on intake's clock since the listing
				// that saw the file as it was, then the upload goes on
				waitStable(t, pool, "acme", name, time.Second)
				appendTo(t, ready, row)
				r.poll("acme")
				if fs := files(t, pool, "acme"); len(fs) != 0 {
					t.Fatalf("after write %d the poll took %+v; a file that grew since the last listing is never ready", i+1, fs)
				}
			}
			// the upload is committed: the gateway stamps its end, the size
			// as it was
			waitStable(t, pool, "acme", name, time.Second)
			end := time.Now().Truncate(time.Second)
			srv.StampMTimes(func(time.Time) time.Time { return end })
			r.poll("acme")
			if fs := files(t, pool, "acme"); len(fs) != 0 {
				t.Fatalf("the poll after the mtime jumped took %+v; a changed mtime starts the clock again", fs)
			}
			waitStable(t, pool, "acme", name, time.Second)
			r.poll("acme")
			fs := files(t, pool, "acme")
			if len(fs) != 1 || fs[0].Name != name || fs[0].State != "archived" || fs[0].Applied != int64(len(rows)) {
				t.Fatalf("got %+v, want %s archived with %d rows", fs, name, len(rows))
			}
			testenv.AssertExactOrders(t, pool, "acme", len(rows), "S")
		})
	}
}
