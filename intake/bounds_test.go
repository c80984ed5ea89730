package intake_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// Rows cut into chunks by bytes (chunk_bytes) as well as rows: a file of
// 2.5 MB of values and 1 MiB chunks lands in several chunks of whole rows;
// a run that fails in the second chunk resumes with the same cut (the
// ledger's line ranges follow one another without gap or overlap) and the
// target ends with every row exactly once.
func TestChunksAreCutByBytesTheSameOnEveryRun(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "cbytes")
	site.Config.Feeds[0].ChunkRows = 1_000_000
	site.Config.Feeds[0].ChunkBytes = partners.MinChunkBytes
	const rows = 40000
	site.Drop(t, "orders-big.csv", testenv.OrdersCSV("B", rows))
	r := newRig(t, pool, "w1", site)
	if err := fault.Set("apply:mid_chunk=error@2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.d.PollOnce(ctx, "cbytes") // the second chunk fails once (retried or left for the next poll)
	fault.Set("")
	r.poll("cbytes")
	fs := files(t, pool, "cbytes")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != rows {
		t.Fatalf("%+v", fs)
	}
	rs, err := pool.Query(ctx, `SELECT chunk_no, first_line, last_line FROM intake_chunk WHERE intake_id = $1 ORDER BY chunk_no`, fs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	next, n := int64(2), 0
	for rs.Next() {
		var no int
		var first, last int64
		if err := rs.Scan(&no, &first, &last); err != nil {
			t.Fatal(err)
		}
		if no != n || first != next || last < first {
			t.Fatalf("chunk %d spans lines %d-%d, want chunk %d from line %d", no, first, last, n, next)
		}
		next, n = last+1, n+1
	}
	if next != rows+2 {
		t.Fatalf("the chunks end at line %d, want %d", next-1, rows+1)
	}
	if n < 3 {
		t.Fatalf("%d chunks: the byte bound did not cut", n)
	}
	testenv.AssertExactOrders(t, pool, "cbytes", rows, "B")
}

// A partner at its spool quota stops claiming (gauge at 1), another
// partner's files go on, and once retention frees its spool (here: its
// spool directory removed) the partner's next file is claimed.
func TestAPartnerOverItsSpoolQuotaStopsClaimingAlone(t *testing.T) {
	_, pool := testenv.DB(t)
	full := testenv.NewSite(t, "quota")
	full.Config.Limits.MaxSpoolBytes = 1
	full.Config.GroupFiles = 1
	other := testenv.NewSite(t, "roomy")
	for i, name := range []string{"orders-q1.csv", "orders-q2.csv"} {
		full.Drop(t, name, testenv.OrdersCSV(fmt.Sprintf("Q%d", i), 3))
		os.Chtimes(filepath.Join(full.Root, "ready", name), time.Now().Add(time.Duration(i-5)*time.Minute), time.Now().Add(time.Duration(i-5)*time.Minute))
	}
	other.Drop(t, "orders-r1.csv", testenv.OrdersCSV("R1", 3))
	other.Drop(t, "orders-r2.csv", testenv.OrdersCSV("R2", 3))
	r := newRig(t, pool, "w1", full, other)
	gauge := func() float64 { return testutil.ToFloat64(r.d.Metrics().QuotaFull.WithLabelValues("quota")) }

	r.poll("quota") // an empty spool: one claim takes it over its quota
	if fs := files(t, pool, "quota"); len(fs) != 1 || fs[0].Name != "orders-q1.csv" || fs[0].State != "archived" {
		t.Fatalf("first poll: %+v, want only the oldest file claimed", fs)
	}
	if gauge() != 1 {
		t.Fatal("the quota gauge is not set after the claim that reached it")
	}
	r.poll("quota")
	if fs := files(t, pool, "quota"); len(fs) != 1 {
		t.Fatalf("a partner at its quota claimed: %+v", fs)
	}
	r.poll("roomy")
	if fs := files(t, pool, "roomy"); len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "archived" {
		t.Fatalf("the other partner: %+v", fs)
	}
	if err := os.RemoveAll(filepath.Join(r.spoolDir, "quota")); err != nil {
		t.Fatal(err)
	}
	r.poll("quota")
	if fs := files(t, pool, "quota"); len(fs) != 2 || fs[1].Name != "orders-q2.csv" || fs[1].State != "archived" {
		t.Fatalf("after the spool was freed: %+v", fs)
	}
}

// A compressed file whose expanded bytes are another file's bytes as
// sent (the spool holds one entry for both) leaves that entry in the
// spool when it is finished: the other file's original, kept for a
// replay, is not its copy to drop.
func TestAnExpandedCopyThatIsAnotherFilesOriginalStaysInTheSpool(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gzsame")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	body := testenv.OrdersCSV("S", 20)
	site.Drop(t, "orders-1.csv", body)
	r := newRig(t, pool, "w1", site)
	r.poll("gzsame")
	site.Drop(t, "orders-2.csv.gz", string(gz(t, []byte(body))))
	r.poll("gzsame")
	var first int64
	var orig, data string
	if err := pool.QueryRow(context.Background(), `SELECT a.intake_id, a.content_sha256, b.data_sha256 FROM file_intake a, file_intake b
		WHERE a.remote_name = 'orders-1.csv' AND b.remote_name = 'orders-2.csv.gz' AND a.state = 'archived' AND b.state IN ('archived', 'duplicate')`).Scan(&first, &orig, &data); err != nil {
		t.Fatal(err)
	}
	if orig != data {
		t.Fatalf("the expanded bytes %s are not the first file's %s", data, orig)
	}
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sp.Path("gzsame", orig)); err != nil {
		t.Fatalf("the first file's original left the spool with the second's expanded copy: %v", err)
	}
	if _, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: first, Actor: "test", Reason: "re-apply"}); err != nil {
		t.Fatalf("replay of the first file: %v", err)
	}
}

// A compressed file's expanded copy leaves the spool once the file is
// finished (the original stays); a replay makes it again from the
// original, and so does a hostile bomb's refusal leave nothing behind.
func TestTheExpandedCopyLeavesTheSpoolOnceTheFileIsFinished(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gzspool")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	site.Config.Limits.MaxExpandedBytes = 1 << 20
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(testenv.OrdersCSV("X", 20)))
	zw.Close()
	site.Drop(t, "orders-x.csv.gz", b.String())
	b.Reset()
	zw = gzip.NewWriter(&b)
	zw.Write(make([]byte, 4<<20))
	zw.Close()
	site.Drop(t, "orders-y.csv.gz", b.String())
	r := newRig(t, pool, "w1", site)
	r.poll("gzspool")
	spooled := func() []string {
		var out []string
		filepath.WalkDir(filepath.Join(r.spoolDir, "gzspool", "sha256"), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				out = append(out, e.Name())
			}
			return nil
		})
		return out
	}
	var id int64
	var data, orig string
	if err := pool.QueryRow(context.Background(), `SELECT intake_id, data_sha256, content_sha256 FROM file_intake WHERE remote_name = 'orders-x.csv.gz' AND state = 'archived'`).Scan(&id, &data, &orig); err != nil {
		t.Fatal(err)
	}
	got := spooled()
	if len(got) != 2 || slices.Contains(got, data) || !slices.Contains(got, orig) {
		t.Fatalf("spool holds %v; want the two originals, not the expanded copy %s", got, data)
	}
	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: id, Actor: "test", Reason: "re-apply"})
	if err != nil {
		t.Fatalf("replay after the expanded copy was removed: %v", err)
	}
	var state string
	var unchanged int64
	if err := pool.QueryRow(context.Background(), `SELECT state, rows_unchanged FROM file_intake WHERE intake_id = $1`, in.ID).Scan(&state, &unchanged); err != nil || state != "archived" || unchanged != 20 {
		t.Fatalf("replay: %s, %d unchanged (%v)", state, unchanged, err)
	}
	if got := spooled(); len(got) != 2 {
		t.Fatalf("after the replay the spool holds %v", got)
	}
	sp, _ := spool.New(r.spoolDir)
	if tmps, _ := sp.TempFiles("gzspool", 0); len(tmps) != 0 {
		t.Fatalf("temp files left: %v", tmps)
	}
}

// A replay whose original the feed in force no longer accepts (here: it
// stopped taking gzip) is held at once with the feed's reason, as the
// file would be if it came now, not retried until its attempts run out:
// making the expanded copy again is the first thing the replay does.
func TestAReplayTheFeedNowRefusesIsHeldWithItsReason(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gzrefuse")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	site.Drop(t, "orders-1.csv.gz", string(gz(t, []byte(testenv.OrdersCSV("R", 20)))))
	r := newRig(t, pool, "w1", site)
	r.poll("gzrefuse")
	fs := files(t, pool, "gzrefuse")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the file archived", fs)
	}

	// a daemon on the same spool whose feed takes no gzip any more
	site.Config.Feeds[0].Compression = nil
	in, err := replayOnSpoolOf(t, pool, r, site, fs[0].ID)
	fs = files(t, pool, "gzrefuse")
	if len(fs) != 2 || fs[1].ID != in.ID || fs[1].State != "quarantined" || fs[1].Reason != "compression_not_allowed" {
		t.Fatalf("rows %+v (replay: %v), want the replay quarantined with compression_not_allowed", fs, err)
	}
	// the partner reads that ops' replay was held, and that the batch's
	// first intake stands: no file in quarantine/ is named
	rc := receipt(t, site, fs[1].Receipt)
	if want := fmt.Sprintf("replay of intake %d", fs[0].ID); !strings.HasPrefix(rc.Detail, want) || rc.Quarantine != "" {
		t.Fatalf("the replay's receipt says %q, quarantine_path %q; want it to begin %q and name no quarantined file", rc.Detail, rc.Quarantine, want)
	}
	if first := receipt(t, site, fs[0].Receipt); first.Outcome != "accepted" {
		t.Fatalf("the first intake's receipt says %s, want accepted", first.Outcome)
	}
}

// A replay of a decrypted file by a daemon whose feed no longer has its
// pgp section is held with the feed's change as its reason, and the
// file's original stays in the spool: taken for its own plaintext, it
// was removed as bytes other than the first time's.
func TestAReplayTheFeedNoLongerDecryptsKeepsItsOriginal(t *testing.T) {
	_, pool := testenv.DB(t)
	site, us, partner := pgpSite(t, "pgpgone", 0)
	site.Drop(t, "orders-1.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("P", 6)), us, partner, false)))
	r := newRig(t, pool, "w1", site)
	r.poll("pgpgone")
	fs := files(t, pool, "pgpgone")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the file archived", fs)
	}
	var sha string
	var size int64
	if err := pool.QueryRow(context.Background(), `SELECT content_sha256, size_bytes FROM file_intake WHERE intake_id = $1`, fs[0].ID).Scan(&sha, &size); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	if !sp.Has("pgpgone", sha, size) {
		t.Fatal("the original is not in the spool after the file's run")
	}

	// a daemon on the same spool whose feed decrypts nothing any more
	site.Config.Feeds[0].PGP = nil
	in, err := replayOnSpoolOf(t, pool, r, site, fs[0].ID)
	fs = files(t, pool, "pgpgone")
	if len(fs) != 2 || fs[1].ID != in.ID || fs[1].State != "quarantined" || fs[1].Reason != "mapping_changed" {
		t.Fatalf("rows %+v (replay: %v), want the replay quarantined with mapping_changed", fs, err)
	}
	if !sp.Has("pgpgone", sha, size) {
		t.Fatal("the file's original left the spool")
	}
}

// replayOnSpoolOf replays intake id by a daemon w2 on r's spool with
// site's config as it is now (a feed changed since r's run); the replay's
// row and the replay's error.
func replayOnSpoolOf(t *testing.T, pool *pgxpool.Pool, r *rig, site *testenv.Site, id int64) (*ledger.Intake, error) {
	t.Helper()
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := intake.New(intake.Config{WorkerID: "w2", Lease: 30 * time.Second, SpoolMinFree: 1}, []partners.Config{site.Validated(t)},
		namedPool(t, pool, "w2"), sp, prometheus.NewRegistry(), testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.Stop)
	in, err := d2.Replay(context.Background(), intake.ReplayRequest{ID: id, Actor: "test", Reason: "re-apply"})
	if in == nil {
		t.Fatalf("replay: %v", err)
	}
	return in, err
}

// A replay handed to the daemons (the ops role's replay) is taken over by
// whichever replica's reconciler runs, whose spool may not hold the bytes
// (a spool of its own): it reads them from the archived copy of the file
// on the site, checked against their hash, and applies the replay.
func TestAHandedOverReplayReadsItsBytesFromTheArchive(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "hand")
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("H", 4))
	r := newRig(t, pool, "w1", site)
	r.poll("hand")
	fs := files(t, pool, "hand")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("rows %+v, want the file archived", fs)
	}
	archived := fs[0].Archive
	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: fs[0].ID, Actor: "test", Reason: "re-apply", Handover: true})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	r2 := newRig(t, pool, "w2", site) // a spool of its own
	r2.reconcileAs("w2", site)
	r2.poll("hand")
	fs = files(t, pool, "hand")
	if len(fs) != 2 || fs[1].ID != in.ID || fs[1].State != "archived" || fs[1].Worker != "w2" || fs[1].Unchanged != 4 {
		t.Fatalf("rows %+v, want the replay archived by w2 with its 4 rows unchanged", fs)
	}
	if _, err := os.Stat(archived); err != nil {
		t.Fatalf("the archived copy left the archive: %v", err)
	}
}

// The files a poll resumes count against the partner's spool quota before
// they have downloaded: the poll's claims beside them stop at the quota as
// if their bytes were in the spool already.
func TestAResumedFileCountsAgainstTheSpoolQuotaOfThePollsClaims(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "rquota")
	site.Config.Limits.MaxSpoolBytes = 1
	site.Config.GroupFiles = 1
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("A", 3))
	if err := fault.Set("download:mid=error"); err != nil {
		t.Fatal(err)
	}
	first := newRig(t, pool, "w1", site)
	if err := first.d.PollOnce(ctx, "rquota"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected stop in the download", err)
	}
	fault.Set("")
	first.d.Stop()
	if fs := files(t, pool, "rquota"); len(fs) != 1 || fs[0].State != "claimed" {
		t.Fatalf("%+v, want the file claimed, not downloaded", fs)
	}
	site.Drop(t, "orders-2.csv", testenv.OrdersCSV("B", 3))
	r := newRig(t, pool, "w1", site) // the same worker id, started again, an empty spool
	r.poll("rquota")
	if fs := files(t, pool, "rquota"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("%+v, want the resumed file archived and no claim past the quota beside it", fs)
	}
}
