package intake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// byName maps a partner's intake rows by remote name (the last row of a
// name wins: a resend comes after its original).
func byName(rows []fileRow) map[string]fileRow {
	m := map[string]fileRow{}
	for _, f := range rows {
		m[f.Name] = f
	}
	return m
}

func grouped(r *rig, partner, result string) float64 {
	return testutil.ToFloat64(r.d.Metrics().Grouped.WithLabelValues(partner, result))
}

// A group of small files keeps each file's own outcome: clean files go
// through together, and a file with a rejected row, an exact resend and a
// file with a repeated key leave the group and end exactly as they would
// alone, each with its own receipt.
func TestGroupKeepsEachFilesOwnOutcome(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "grp")
	site.Drop(t, "orders-b1.csv", goodRows("B1", 10))
	r := newRig(t, pool, "w1", site)
	r.poll("grp") // alone: one file is no group
	if got := grouped(r, "grp", "grouped"); got != 0 {
		t.Fatalf("a single file went through a group (%v)", got)
	}

	site.Drop(t, "orders-g1.csv", goodRows("G1", 10))
	site.Drop(t, "orders-g2.csv", goodRows("G2", 10))
	site.Drop(t, "orders-rej.csv", header+
		"R-1,a@example.com,10.00,paid,2026-11-01T10:00:00Z,1\n"+
		"R-2,a@example.com,not-a-number,paid,2026-11-01T10:00:00Z,1\n"+
		"R-3,a@example.com,30.00,paid,2026-11-01T10:00:00Z,1\n")
	site.Drop(t, "orders-b1.csv", goodRows("B1", 10)) // the exact bytes again
	site.Drop(t, "orders-dk.csv", header+
		"D-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
		"D-1,a@b.io,3.00,paid,2026-11-01T00:00:00Z,1\n")
	r.poll("grp")

	if got := grouped(r, "grp", "grouped"); got != 5 {
		t.Fatalf("%v files went through a group, want 5", got)
	}
	for reason, want := range map[string]float64{intake.LeftRejected: 1, intake.LeftBatchBound: 1, intake.LeftRepeatedKey: 1, intake.LeftGroupFailed: 0} {
		if got := grouped(r, "grp", reason); got != want {
			t.Fatalf("%v files left the group as %s, want %v", got, reason, want)
		}
	}
	fs := files(t, pool, "grp")
	if len(fs) != 6 {
		t.Fatalf("%d intake rows, want 6", len(fs))
	}
	m := byName(fs)
	for _, name := range []string{"orders-g1.csv", "orders-g2.csv"} {
		f := m[name]
		if f.State != "archived" || f.Applied != 10 || f.Total != 10 || f.Chunks != 1 || f.Rejects != "" {
			t.Fatalf("%s: %+v, want archived with 10 applied in one chunk", name, f)
		}
		rc := receipt(t, site, f.Receipt)
		if rc.Outcome != ledger.OutcomeAccepted || rc.IntakeID != f.ID || rc.File != name || rc.Rows.Applied != 10 || rc.Archive != f.Archive {
			t.Fatalf("%s: receipt %+v", name, rc)
		}
		if got := count(t, pool, `SELECT count(*) FROM orders WHERE last_intake_id = $1`, f.ID); got != 10 {
			t.Fatalf("%s: %d target rows carry its intake id, want 10", name, got)
		}
	}
	if f := m["orders-rej.csv"]; f.State != "archived" || f.Applied != 2 || f.Rejected != 1 || receipt(t, site, f.Receipt).Outcome != ledger.OutcomeAcceptedWithRejects {
		t.Fatalf("the file with a rejected row: %+v", f)
	}
	if f := m["orders-dk.csv"]; f.State != "archived" || f.Applied != 1 || f.Rejected != 1 {
		t.Fatalf("the file with a repeated key: %+v", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id = 'D-1' AND amount = 3.00`); n != 1 {
		t.Fatal("the last line of a repeated key did not win")
	}
	if f := m["orders-b1.csv"]; f.State != "duplicate" || receipt(t, site, f.Receipt).Outcome != ledger.OutcomeDuplicate {
		t.Fatalf("the exact resend: %+v", f)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'grp'`); got != 10+10+10+2+1 {
		t.Fatalf("target holds %d rows, want 33", got)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
	if got := site.Files(t, "reports"); len(got) != 6+2 { // a receipt each, two rejects reports
		t.Fatalf("reports/ holds %v, want 6 receipts and 2 rejects reports", got)
	}
}

// When a group's keys already exist, the target refuses the group's COPY
// and each file is merged in intake id order inside the group's one
// transaction: unchanged rows are counted unchanged, and of two files of
// the group writing one key the later one wins, as it would alone.
func TestGroupMergesInIntakeOrderWhenKeysExist(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "grm")
	site.Drop(t, "orders-1.csv", goodRows("M", 10))
	r := newRig(t, pool, "w1", site)
	r.poll("grm")

	site.Drop(t, "orders-2.csv", goodRows("M", 12)) // 10 unchanged, 2 new
	site.Drop(t, "orders-3.csv", header+"M-12,z@example.com,99.00,shipped,2026-11-01T10:00:00Z,7\n")
	site.Drop(t, "orders-4.csv", goodRows("N", 3))
	r.poll("grm")
	if got := grouped(r, "grm", "grouped"); got != 3 {
		t.Fatalf("%v files went through a group, want 3", got)
	}
	m := byName(files(t, pool, "grm"))
	f2, f3, f4 := m["orders-2.csv"], m["orders-3.csv"], m["orders-4.csv"]
	if f2.State != "archived" || f2.Applied != 2 || f2.Unchanged != 10 || f2.Confl != 0 {
		t.Fatalf("orders-2: %+v, want 2 applied and 10 unchanged", f2)
	}
	if f3.State != "archived" || f3.Applied != 1 || f4.State != "archived" || f4.Applied != 3 {
		t.Fatalf("orders-3 %+v, orders-4 %+v", f3, f4)
	}
	if !(f2.ID < f3.ID) {
		t.Fatalf("ids %d, %d: not in listing order", f2.ID, f3.ID)
	}
	var amount string
	var last int64
	if err := pool.QueryRow(t.Context(), `SELECT amount::text, last_intake_id FROM orders WHERE partner_id = 'grm' AND order_id = 'M-12'`).Scan(&amount, &last); err != nil {
		t.Fatal(err)
	}
	if amount != "99.00" || last != f3.ID {
		t.Fatalf("M-12 = %s by intake %d, want 99.00 by the later file %d", amount, last, f3.ID)
	}
	if got := count(t, pool, `SELECT count(*) FROM intake_chunk c JOIN file_intake f USING (intake_id) WHERE f.partner_id = 'grm'`); got != 4 {
		t.Fatalf("ledger holds %d chunks, want one per file (4)", got)
	}
}

// A group that takes longer than its lease keeps its files: the group's
// heartbeat extends every file's lease (a takeover would otherwise find
// them expired and fence the group out).
func TestGroupHeartbeatKeepsItsFilesPastTheLease(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "ghb")
	for _, p := range []string{"HA", "HB", "HC"} {
		site.Drop(t, "orders-"+p+".csv", goodRows(p, 10))
	}
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 3 * time.Second, SpoolMinFree: 1}, site)
	hb := &intake.Signals(r.d).GroupHeartbeat
	hb.Init(t)
	resume := r.pollPaused("ghb", "spool:after")
	// more than a lease: heartbeats until the earliest lease held at the
	// pause has run out
	var leaseEnd time.Time
	if err := pool.QueryRow(t.Context(), `SELECT min(lease_until) FROM file_intake WHERE partner_id = 'ghb'`).Scan(&leaseEnd); err != nil {
		t.Fatal(err)
	}
	for past := false; !past; {
		hb.WaitOrTimeout()
		if err := pool.QueryRow(t.Context(), `SELECT now() > $1`, leaseEnd).Scan(&past); err != nil {
			t.Fatal(err)
		}
	}
	live := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'ghb' AND state = 'spooled' AND lease_until > now()`)
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if live != 3 {
		t.Fatalf("%d of 3 files held a live lease after more than a lease of work", live)
	}
	for _, f := range files(t, pool, "ghb") {
		if f.State != "archived" || f.Applied != 10 {
			t.Fatalf("%+v, want archived", f)
		}
	}
}

// Files of a group that leave it late: one whose remote file vanished
// before the group read it (it fails alone as remote_lost, the others
// go on), and one whose rows a newer intake holds (its conflicts need a
// rejects report, written on the per-file path from applied).
func TestGroupFilesThatLeaveLate(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gl")
	site.Drop(t, "orders-0.csv", goodRows("L", 3))
	r := newRig(t, pool, "w1", site)
	r.poll("gl")
	// a newer intake (as far as the target says) holds L-2
	if _, err := pool.Exec(context.Background(), `UPDATE orders SET last_intake_id = 1000000 WHERE partner_id = 'gl' AND order_id = 'L-2'`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", header+ordersLine("L", 2, "5.00")+ordersLine("L", 3, "6.00"))
	site.Drop(t, "orders-2.csv", goodRows("M", 2))
	site.Drop(t, "orders-3.csv", goodRows("N", 2))
	resume := r.pollPaused("gl", "claim:after_rename")
	// gone from processing/ before the group reads it
	if err := os.Remove(filepath.Join(site.Root, "processing", "w1", "orders-3.csv")); err != nil {
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if got := grouped(r, "gl", intake.LeftRead); got != 1 {
		t.Fatalf("%v files left the group unread, want 1", got)
	}
	if got := grouped(r, "gl", intake.LeftConflicts); got != 1 {
		t.Fatalf("%v files left the group for their conflicts, want 1", got)
	}
	m := byName(files(t, pool, "gl"))
	if f := m["orders-3.csv"]; f.State != "failed_terminal" || f.Reason != string(reason.RemoteLost) {
		t.Fatalf("the vanished file: %+v, want failed_terminal remote_lost", f)
	}
	if f := m["orders-2.csv"]; f.State != "archived" || f.Applied != 2 {
		t.Fatalf("the clean file: %+v", f)
	}
	f := m["orders-1.csv"]
	if f.State != "archived" || f.Applied != 1 || f.Confl != 1 || f.Rejects == "" {
		t.Fatalf("the file with a conflict: %+v, want archived, 1 applied, 1 conflict, a rejects report", f)
	}
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Conflict != 1 {
		t.Fatalf("receipt %+v", rc)
	}
	rel, _ := filepath.Rel(site.Root, f.Rejects)
	if got := site.Read(t, rel); !strings.Contains(got, "2,,newer_write,conflict") {
		t.Fatalf("rejects.csv:\n%s", got)
	}
	var amount string
	if err := pool.QueryRow(context.Background(), `SELECT amount::text FROM orders WHERE partner_id = 'gl' AND order_id = 'L-2'`).Scan(&amount); err != nil || amount != "20.02" {
		t.Fatalf("L-2 = %s (%v): the newer write was overwritten", amount, err)
	}
}

// Two workers claiming one partner's small files in groups at the same
// moment: intake ids (which decide which of two files writing one key
// wins) still follow the files' age, as they do for single claims.
func TestRacingGroupsKeepIdsInFileAge(t *testing.T) {
	for round := 0; round < 3; round++ {
		_, pool := testenv.DB(t)
		site := testenv.NewSite(t, "race")
		base := time.Now().Add(-time.Hour)
		const n = 64
		for i := 0; i < n; i++ {
			name := fmt.Sprintf("orders-%03d.csv", i)
			site.Drop(t, name, goodRows(fmt.Sprintf("R%03d", i), 2))
			at := base.Add(time.Duration(i) * time.Second)
			if err := os.Chtimes(filepath.Join(site.Root, "ready", name), at, at); err != nil {
				t.Fatal(err)
			}
		}
		a, b := newRig(t, pool, "wa", site), newRig(t, pool, "wb", site)
		var wg sync.WaitGroup
		for _, r := range []*rig{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := r.d.PollOnce(ctx, "race"); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		fs := files(t, pool, "race")
		if len(fs) != n {
			t.Fatalf("%d intake rows, want %d", len(fs), n)
		}
		// files() is in id order: their names (ages) must be too
		for i := 1; i < len(fs); i++ {
			if fs[i-1].Name > fs[i].Name {
				t.Fatalf("round %d: %s (worker %s) has intake id %d, the older %s (worker %s) %d",
					round, fs[i-1].Name, fs[i-1].Worker, fs[i-1].ID, fs[i].Name, fs[i].Worker, fs[i].ID)
			}
		}
	}
}

// A group does not wait for the CLOSE of a file it has read (one round
// trip less): a CLOSE that fails is logged and changes nothing that was
// decided of the file, which goes on with its group.
func TestGroupCloseFailureAfterReadIsHarmless(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gcf")
	for _, p := range []string{"CA", "CB", "CC"} {
		site.Drop(t, "orders-"+p+".csv", goodRows(p, 4))
	}
	r := newRig(t, pool, "w1", site)
	if err := fault.Set("group:close=error@2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	r.poll("gcf")
	if got := fault.Hits("group:close"); got != 3 {
		t.Fatalf("the group's closes reached the fault %d times, want 3", got)
	}
	fault.Set("")
	if got := grouped(r, "gcf", "grouped"); got != 3 {
		t.Fatalf("%v files went through a group, want 3", got)
	}
	for _, reason := range []string{intake.LeftRead, intake.LeftArchive, intake.LeftGroupFailed} {
		if got := grouped(r, "gcf", reason); got != 0 {
			t.Fatalf("%v files left the group as %s", got, reason)
		}
	}
	for _, f := range files(t, pool, "gcf") {
		if f.State != "archived" || f.Applied != 4 || f.Total != 4 {
			t.Fatalf("%+v, want archived with 4 rows applied", f)
		}
		if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Applied != 4 || rc.Archive != f.Archive {
			t.Fatalf("receipt %+v", rc)
		}
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ still holds %v", got)
	}
}

// A group reads each file as the size it was listed with, in one round
// trip (a READ of that size and one past it together): a file that grew
// or shrank after the listing leaves the group unread and goes on alone,
// which takes what the file now holds.
func TestGroupFileOfAnotherSizeLeavesTheGroup(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gsz")
	site.Drop(t, "orders-1.csv", goodRows("S", 3))
	site.Drop(t, "orders-2.csv", goodRows("T", 3))
	site.Drop(t, "orders-3.csv", goodRows("U", 3))
	r := newRig(t, pool, "w1", site)
	resume := r.pollPaused("gsz", "claim:after_rename")
	dir := filepath.Join(site.Root, "processing", "w1")
	if err := os.WriteFile(filepath.Join(dir, "orders-1.csv"), []byte(goodRows("S", 4)), 0o644); err != nil { // grew
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "orders-3.csv"), []byte(goodRows("U", 2)), 0o644); err != nil { // shrank
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if got := grouped(r, "gsz", intake.LeftRead); got != 2 {
		t.Fatalf("%v files left the group unread, want 2", got)
	}
	m := byName(files(t, pool, "gsz"))
	for name, rows := range map[string]int64{"orders-1.csv": 4, "orders-2.csv": 3, "orders-3.csv": 2} {
		if f := m[name]; f.State != "archived" || f.Total != rows || f.Applied != rows {
			t.Fatalf("%s: %+v, want archived with %d rows", name, f, rows)
		}
	}
}

// A group writes its receipts' bytes beside its archive moves into
// temporary files opened beside its reads, then renames them: a partner
// watching reports/ only ever sees whole receipts (every name it can read
// is a complete, valid receipt), and no temporary file stays behind.
func TestGroupReceiptsAppearComplete(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "grc")
	const n = 24
	for i := 0; i < n; i++ {
		site.Drop(t, fmt.Sprintf("orders-%02d.csv", i), goodRows(fmt.Sprintf("RC%02d", i), 5))
	}
	r := newRig(t, pool, "w1", site)
	dir := filepath.Join(site.Root, "reports")
	stop := make(chan struct{})
	seen := map[string]bool{}
	var bad []string
	var watch sync.WaitGroup
	watch.Add(1)
	go func() { // the partner, reading every receipt as soon as it is listed
		defer watch.Done()
		for done := false; !done; {
			select {
			case <-stop:
				done = true // one last look after the poll
			default:
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if sitefile.IsOurTemp(e.Name()) || seen[e.Name()] {
					continue
				}
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err != nil {
					continue // renamed over meanwhile
				}
				var rc sitefile.Receipt
				if err := json.Unmarshal(b, &rc); err != nil || rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Applied != 5 || rc.Archive == "" {
					bad = append(bad, fmt.Sprintf("%s: %q", e.Name(), b))
					continue
				}
				seen[e.Name()] = true
			}
		}
	}()
	r.poll("grc")
	close(stop)
	watch.Wait()
	if len(bad) > 0 {
		t.Fatalf("a partner read incomplete receipts: %v", bad)
	}
	if len(seen) != n {
		t.Fatalf("the partner read %d whole receipts, want %d", len(seen), n)
	}
	if got := grouped(r, "grc", "grouped"); got != n {
		t.Fatalf("%v files went through a group, want %d", got, n)
	}
	for _, f := range files(t, pool, "grc") {
		rc := receipt(t, site, f.Receipt)
		if f.State != "archived" || rc.Archive != f.Archive || rc.IntakeID != f.ID {
			t.Fatalf("%+v: receipt %+v", f, rc)
		}
		if _, err := os.Stat(f.Archive); err != nil {
			t.Fatalf("the receipt names archive %s: %v", f.Archive, err)
		}
	}
	if got := site.Files(t, "reports"); len(got) != n {
		t.Fatalf("reports/ holds %v, want the %d receipts alone", got, n)
	}
}

// The receipt a group writes ahead names the archive name its move
// takes first; when that name is taken (only an earlier run of the very
// same step could have taken it), the move takes the next free one and
// the receipt is written anew naming it.
func TestGroupReceiptNamesTheArchiveTheMoveTook(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gat")
	site.Drop(t, "orders-1.csv", goodRows("AT", 3))
	site.Drop(t, "orders-2.csv", goodRows("AU", 3))
	r := newRig(t, pool, "w1", site)
	resume := r.pollPaused("gat", "apply:after_commit")
	var id int64
	var batch, sha string
	var claimed time.Time
	if err := pool.QueryRow(t.Context(), `SELECT intake_id, batch_id, content_sha256, claimed_at FROM file_intake
		WHERE partner_id = 'gat' AND remote_name = 'orders-1.csv'`).Scan(&id, &batch, &sha, &claimed); err != nil {
		t.Fatal(err)
	}
	month := filepath.Join(site.Root, "archive", claimed.UTC().Format("2006"), claimed.UTC().Format("01"))
	if err := os.MkdirAll(month, 0o755); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(month, fmt.Sprintf("%s.%s.%d.csv", batch, sha[:12], id))
	if err := os.WriteFile(first, []byte("not ours\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	m := byName(files(t, pool, "gat"))
	f := m["orders-1.csv"]
	if f.State != "archived" || f.Archive == first || !strings.HasPrefix(f.Archive, strings.TrimSuffix(first, ".csv")) {
		t.Fatalf("%+v: want archived under a name beside the taken %s", f, first)
	}
	if rc := receipt(t, site, f.Receipt); rc.Archive != f.Archive {
		t.Fatalf("the receipt names archive %s, the file is at %s", rc.Archive, f.Archive)
	}
	if got := site.Read(t, strings.TrimPrefix(first, site.Root+"/")); got != "not ours\n" {
		t.Fatal("the taken archive name was overwritten")
	}
	if g := m["orders-2.csv"]; g.State != "archived" || receipt(t, site, g.Receipt).Archive != g.Archive {
		t.Fatalf("the other file: %+v", g)
	}
	if got := site.Files(t, "reports"); len(got) != 2 {
		t.Fatalf("reports/ holds %v, want 2 receipts", got)
	}
}

// The groups that follow a group while the partner's pool has free slots
// are claimed with it, in one claim section, and then run side by side,
// each its own transaction: every file is applied once and archived, and
// intake ids still follow the files' age across the groups.
func TestGroupsOfOnePartnerInFlightKeepIdsInFileAge(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gif")
	site.Config.GroupFiles, site.Config.Concurrency = 4, 3
	base := time.Now().Add(-time.Hour)
	const n = 22 // three groups of four at once, then the rest as slots free
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("orders-%03d.csv", i)
		site.Drop(t, name, goodRows(fmt.Sprintf("IF%03d", i), 2))
		at := base.Add(time.Duration(i) * time.Second)
		if err := os.Chtimes(filepath.Join(site.Root, "ready", name), at, at); err != nil {
			t.Fatal(err)
		}
	}
	r := newRig(t, pool, "w1", site)
	r.poll("gif")
	if got := grouped(r, "gif", "grouped"); got != n {
		t.Fatalf("%v files went through groups, want %d", got, n)
	}
	fs := files(t, pool, "gif")
	if len(fs) != n {
		t.Fatalf("%d intake rows, want %d", len(fs), n)
	}
	for i, f := range fs { // in id order
		if want := fmt.Sprintf("orders-%03d.csv", i); f.Name != want {
			t.Fatalf("intake id %d is %s, want %s: ids do not follow file age", f.ID, f.Name, want)
		}
		if f.State != "archived" || f.Applied != 2 || receipt(t, site, f.Receipt).Archive != f.Archive {
			t.Fatalf("%+v, want archived with 2 rows and its receipt", f)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM intake_chunk c JOIN file_intake f USING (intake_id) WHERE f.partner_id = 'gif'`); got != n {
		t.Fatalf("ledger holds %d chunks, want %d", got, n)
	}
}

// The group's transaction to applied is its publication fence (it matched
// every file's token and renewed its lease) only while it is younger than
// a third of a lease: a group stalled longer after it checks its tokens
// again before its moves and receipts, and a group whose files were taken
// over meanwhile publishes nothing.
func TestGroupStalledAfterItsCommitPublishesNothing(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "gst")
	site.Drop(t, "orders-1.csv", goodRows("ST", 3))
	site.Drop(t, "orders-2.csv", goodRows("SU", 3))
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 3 * time.Second, SpoolMinFree: 1}, site)
	resume := r.pollPaused("gst", "apply:after_commit")
	// wait (not a timing assertion) until the transaction that renewed
	// the leases is more than a third of a lease old
	testenv.WaitFor(t, time.Minute, func() bool {
		var stale bool
		if err := pool.QueryRow(t.Context(), `SELECT bool_and(clock_timestamp() - updated_at > interval '1200 ms')
			FROM file_intake WHERE partner_id = 'gst' AND state = 'applied'`).Scan(&stale); err != nil {
			t.Fatal(err)
		}
		return stale
	})
	// another replica takes the files over (as the reconciler does once a
	// lease ran out)
	if n := count(t, pool, `WITH u AS (UPDATE file_intake SET fencing_token = fencing_token + 1, worker_id = 'w2', updated_at = now()
		WHERE partner_id = 'gst' AND state = 'applied' RETURNING 1) SELECT count(*) FROM u`); n != 2 {
		t.Fatalf("took %d files over, want 2", n)
	}
	_ = resume() // the stalled group's poll; what it returns is not the point
	if got := site.Files(t, "archive"); len(got) != 0 {
		t.Fatalf("the fenced-out group moved files to archive/: %v", got)
	}
	if got := site.Files(t, "reports"); len(got) != 0 {
		t.Fatalf("the fenced-out group published in reports/: %v", got)
	}
	if got := site.Files(t, "processing"); len(got) != 2 {
		t.Fatalf("processing/ holds %v, want the two files left for their new owner", got)
	}
	for _, f := range files(t, pool, "gst") {
		if f.State != "applied" || f.Worker != "w2" {
			t.Fatalf("%+v, want applied and w2's", f)
		}
	}
}
