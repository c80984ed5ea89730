package intake_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// ordersFile is a valid orders file of one row per key, each key's amount
// given.
func ordersFile(rows ...[2]string) string {
	s := header
	for i, r := range rows {
		s += r[0] + ",c@example.com," + r[1] + ",paid,2026-11-02T10:00:00Z," + string(rune('1'+i)) + "\n"
	}
	return s
}

func replayedRow(t *testing.T, r *rig, key string) (string, int64) {
	t.Helper()
	var amount string
	var writer int64
	if err := r.pool.QueryRow(context.Background(), `SELECT amount::text, last_intake_id FROM orders WHERE partner_id = 'acme' AND order_id = $1`, key).Scan(&amount, &writer); err != nil {
		t.Fatalf("row %s: %v", key, err)
	}
	return amount, writer
}

// A replay of a duplicate applies the bytes the original intake brought,
// as that intake: a row a later intake wrote since is a conflict of the
// replay, never set back to the duplicate's older values.
func TestReplayOfADuplicateNeverOverwritesALaterIntakesRow(t *testing.T) {
	defer intake.SetScanCheckBytes(0)()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	first := ordersFile([2]string{"RP-1", "1.00"})
	site.Drop(t, "orders-1.csv", first)
	r.poll("acme")
	site.Drop(t, "orders-2.csv", ordersFile([2]string{"RP-1", "2.00"}))
	r.poll("acme")
	site.Drop(t, "orders-1.csv", first)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[0].State != "archived" || fs[1].State != "archived" || fs[1].Applied != 1 || fs[2].State != "duplicate" {
		t.Fatalf("got %+v, want orders-1 and orders-2 archived, then orders-1's resend a duplicate", fs)
	}
	if amount, w := replayedRow(t, r, "RP-1"); amount != "2.00" || w != fs[1].ID {
		t.Fatalf("before the replay RP-1 is %s by intake %d, want 2.00 by %d", amount, w, fs[1].ID)
	}

	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: fs[2].ID, Actor: "test", Reason: "mapping fixed"})
	if err != nil {
		t.Fatal(err)
	}
	if amount, w := replayedRow(t, r, "RP-1"); amount != "2.00" || w != fs[1].ID {
		t.Fatalf("after the replay RP-1 is %s by intake %d: the replay overwrote orders-2's row (want 2.00 by %d)", amount, w, fs[1].ID)
	}
	fs = files(t, pool, "acme")
	got := fs[len(fs)-1]
	if got.ID != in.ID || got.State != "archived" || got.Confl != 1 || got.Applied != 0 || got.Unchanged != 0 {
		t.Fatalf("replay %+v, want archived with 1 conflict and nothing applied", got)
	}
	rc := receipt(t, site, got.Receipt)
	if rc.IntakeID != in.ID || rc.Rows.Conflict != 1 || rc.Rows.Applied != 0 {
		t.Fatalf("replay receipt %+v, want the conflict reported", rc)
	}
	if in.ReplayOf != fs[0].ID {
		t.Fatalf("the replay of duplicate %d writes as intake %d, want the original %d", fs[2].ID, in.ReplayOf, fs[0].ID)
	}
	if got.Rejects == "" {
		t.Fatal("the replay's conflict has no rejects report")
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict' AND reason = 'newer_write'`, in.ID); n != 1 {
		t.Fatalf("the replay recorded %d newer_write conflicts, want 1", n)
	}
}

// A replay of a file no later intake touched applies it again: no false
// conflicts, whether the archived original or a duplicate of it is
// replayed, and its rows are written as the original.
func TestReplayOfAnUntouchedFileApplies(t *testing.T) {
	defer intake.SetScanCheckBytes(0)()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	data := ordersFile([2]string{"RU-1", "1.00"}, [2]string{"RU-2", "3.00"})
	site.Drop(t, "orders-u.csv", data)
	r.poll("acme")
	site.Drop(t, "orders-other.csv", ordersFile([2]string{"RO-1", "5.00"}))
	r.poll("acme")
	site.Drop(t, "orders-u.csv", data)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[0].State != "archived" || fs[2].State != "duplicate" {
		t.Fatalf("got %+v, want the file archived, another, then its resend a duplicate", fs)
	}
	orig, dup := fs[0].ID, fs[2].ID
	for _, id := range []int64{orig, dup} {
		// the row was lost from the target: the replay writes it again
		if _, err := pool.Exec(context.Background(), `DELETE FROM orders WHERE partner_id = 'acme' AND order_id = 'RU-2'`); err != nil {
			t.Fatal(err)
		}
		in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: id, Actor: "test", Reason: "rows lost"})
		if err != nil {
			t.Fatalf("replay of %d: %v", id, err)
		}
		fs = files(t, pool, "acme")
		got := fs[len(fs)-1]
		if got.ID != in.ID || got.State != "archived" || got.Confl != 0 || got.Applied != 1 || got.Unchanged != 1 {
			t.Fatalf("replay of %d: %+v, want archived with 1 applied, 1 unchanged, no conflict", id, got)
		}
		if rc := receipt(t, site, got.Receipt); rc.Rows.Conflict != 0 || rc.Rows.Applied != 1 {
			t.Fatalf("replay of %d: receipt %+v", id, rc)
		}
		for _, k := range []string{"RU-1", "RU-2"} {
			if _, w := replayedRow(t, r, k); w != orig {
				t.Fatalf("replay of %d: %s written by intake %d, want the original %d", id, k, w, orig)
			}
		}
	}
}

// A replay after a fix writes rows its original did not write the first
// time (the target refused them). A newer file that found such a row as
// it was left no mark on it, so the replay would set it back to the
// older file's value: it holds those rows back as newer_write conflicts,
// whether the newer file's rows are in the spool or come from a
// compressed original expanded again, and writes the rest. A newer file
// it cannot read holds back every row it would write for the first time.
func TestAReplayAfterAFixLeavesWhatANewerFileFoundAsItIs(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	r := newRig(t, pool, "w1", site)
	ordersFile := func(rows ...[2]string) string { // every row's other values alike
		s := header
		for _, r := range rows {
			s += r[0] + ",c@example.com," + r[1] + ",paid,2026-11-02T10:00:00Z,1\n"
		}
		return s
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders ADD CONSTRAINT amount_cap CHECK (amount < 100)`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", ordersFile([2]string{"RF-1", "1.00"}, [2]string{"RF-2", "2.00"}, [2]string{"RF-3", "3.00"}))
	r.poll("acme")
	// the file replayed later: three of its rows refused by the target
	site.Drop(t, "orders-2.csv", ordersFile([2]string{"RF-1", "1.00"}, [2]string{"RF-2", "200.00"}, [2]string{"RF-3", "300.00"}, [2]string{"RF-4", "400.00"}))
	r.poll("acme")
	// newer files that find RF-2 and RF-3 as they are
	site.Drop(t, "orders-3.csv", ordersFile([2]string{"RF-2", "2.00"}, [2]string{"RF-5", "5.00"}))
	r.poll("acme")
	site.Drop(t, "orders-4.csv.gz", string(gz(t, []byte(ordersFile([2]string{"RF-3", "3.00"})))))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 4 || fs[1].Rejected != 3 || fs[2].Unchanged != 1 || fs[3].Unchanged != 1 {
		t.Fatalf("files %+v, want orders-2 with 3 rejected rows and each newer file finding its row as it is", fs)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders DROP CONSTRAINT amount_cap`); err != nil {
		t.Fatal(err)
	}
	in, err := r.d.Replay(ctx, intake.ReplayRequest{ID: fs[1].ID, Actor: "test", Reason: "target fixed"})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"RF-1": "1.00", "RF-2": "2.00", "RF-3": "3.00", "RF-4": "400.00", "RF-5": "5.00"} {
		if amount, _ := replayedRow(t, r, key); amount != want {
			t.Errorf("after the replay %s is %s, want %s", key, amount, want)
		}
	}
	got := files(t, pool, "acme")[4]
	if got.ID != in.ID || got.State != "archived" || got.Applied != 1 || got.Unchanged != 1 || got.Confl != 2 {
		t.Fatalf("replay %+v, want archived with RF-4 applied, RF-1 unchanged, RF-2 and RF-3 in conflict", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict' AND reason = 'newer_write'
		AND detail = 'a newer file of the table named the key'`, in.ID); n != 2 {
		t.Fatalf("the replay recorded %d newer_write conflicts naming a newer file, want 2", n)
	}
	if rc := receipt(t, site, got.Receipt); rc.Rows.Conflict != 2 || rc.Rows.Applied != 1 {
		t.Fatalf("replay receipt %+v, want its 2 conflicts and 1 row applied", rc)
	}

	// orders-2's rejected rows purged (retention.row_issues): which rows
	// it did not write is not known, so every row is looked for
	if _, err := pool.Exec(ctx, `DELETE FROM intake_row_issue WHERE intake_id = $1`, fs[1].ID); err != nil {
		t.Fatal(err)
	}
	in, err = r.d.Replay(ctx, intake.ReplayRequest{ID: fs[1].ID, Actor: "test", Reason: "issues purged"})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict'
		AND detail = 'a newer file of the table named the key'`, in.ID); n != 2 {
		t.Fatalf("the replay of a file whose rejected rows were purged recorded %d conflicts naming a newer file, want 2", n)
	}
	// orders-3's bytes gone from this spool (another replica ran it, or
	// the spool's retention passed): read from its archived copy
	var sha string
	if err := pool.QueryRow(ctx, `SELECT content_sha256 FROM file_intake WHERE intake_id = $1`, fs[2].ID).Scan(&sha); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Remove("acme", sha); err != nil {
		t.Fatal(err)
	}
	in, err = r.d.Replay(ctx, intake.ReplayRequest{ID: fs[1].ID, Actor: "test", Reason: "again"})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict'
		AND detail = 'a newer file of the table named the key'`, in.ID); n != 2 {
		t.Fatalf("the replay with orders-3 read from its archived copy recorded %d conflicts naming a newer file, want 2", n)
	}
	// and gone from the site too: what it named is not known
	if err := sp.Remove("acme", sha); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(fs[2].Archive); err != nil {
		t.Fatal(err)
	}
	in, err = r.d.Replay(ctx, intake.ReplayRequest{ID: fs[1].ID, Actor: "test", Reason: "again"})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict' AND reason = 'newer_write'
		AND detail LIKE '%could not be read'`, in.ID); n != 4 {
		t.Fatalf("the replay recorded %d conflicts for an unread newer file, want 4 (its rejected rows purged: every row)", n)
	}
	for key, want := range map[string]string{"RF-2": "2.00", "RF-3": "3.00", "RF-4": "400.00"} {
		if amount, _ := replayedRow(t, r, key); amount != want {
			t.Errorf("after the last replay %s is %s, want %s", key, amount, want)
		}
	}
}

// A replay run by another replica after a mapping change reads a newer
// file from its archived copy on the site, under the feed as configured
// now: a row the newer file applied that no longer reads as valid (the
// change refuses it) names a key that is not known, so every row the
// replay writes for the first time is held back.
func TestAReplayHoldsBackWhatANewerFileNamedUnderAnotherMapping(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	line := func(key, amount, status string) string {
		return key + ",c@example.com," + amount + "," + status + ",2026-11-02T10:00:00Z,1\n"
	}
	site.Drop(t, "orders-1.csv", header+line("RM-1", "1.00", "paid"))
	r.poll("acme")
	site.Drop(t, "orders-2.csv", header+line("RM-1", "9.00", "weird")+line("RM-2", "2.00", "new"))
	r.poll("acme")
	site.Drop(t, "orders-3.csv", header+line("RM-1", "1.00", "paid"))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[1].Rejected != 1 || fs[2].Unchanged != 1 {
		t.Fatalf("files %+v, want orders-2's row rejected and orders-3 finding RM-1 as it is", fs)
	}
	// the mapping now takes orders-2's status and no longer orders-3's
	for i, c := range site.Config.Feeds[0].Columns {
		if c.Name == "status" {
			site.Config.Feeds[0].Columns[i].Values = []string{"new", "shipped", "weird"}
		}
	}
	r2 := newRigOn(t, pool, intake.Config{WorkerID: "w2", Lease: 30 * time.Second, SpoolMinFree: 1}, r.spoolDir, site) // restarted with the change
	in, err := r2.d.Replay(ctx, intake.ReplayRequest{ID: fs[1].ID, Actor: "test", Reason: "mapping fixed"})
	if err != nil {
		t.Fatal(err)
	}
	var amount, status string
	if err := pool.QueryRow(ctx, `SELECT amount::text, status FROM orders WHERE partner_id = 'acme' AND order_id = 'RM-1'`).Scan(&amount, &status); err != nil {
		t.Fatal(err)
	}
	if amount != "1.00" || status != "paid" {
		t.Fatalf("after the replay RM-1 is %s %s, want orders-3's 1.00 paid", amount, status)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND outcome = 'conflict' AND reason = 'newer_write'
		AND detail LIKE '%could not be read'`, in.ID); n != 1 {
		t.Fatalf("the replay recorded %d conflicts for a newer file it cannot read as judged, want 1", n)
	}
}

// A purge that decided a file's spooled bytes were past their retention
// leaves them when a replay of the file began since: the replay renews
// their mtime before it records its row (spool.Keep), and the purge looks
// at each again right before it removes it. Before, the bytes were
// removed under the replay (its run failed, or as here went, then lost
// them while its row said finished now).
func TestAPurgeLeavesTheBytesOfAReplayBegunSinceItsDecision(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	data := ordersFile([2]string{"PR-1", "1.00"})
	site.Drop(t, "orders-p.csv", data)
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	var sha string
	if err := pool.QueryRow(ctx, `SELECT content_sha256 FROM file_intake WHERE intake_id = $1`, f.ID).Scan(&sha); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(r.spoolDir)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-200 * 24 * time.Hour)
	if err := os.Chtimes(sp.Path("acme", sha), old, old); err != nil {
		t.Fatal(err)
	}
	execArgs(t, pool, `UPDATE file_intake SET finished_at = $2 WHERE intake_id = $1`, f.ID, old)
	if err := fault.Set("purge:before_remove=pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Resume("purge:before_remove"); fault.Set("") })
	done := make(chan error, 1)
	go func() {
		_, err := ops.Purge(ctx, pool, sp, []partners.Config{site.Validated(t)}, ops.Retention{Spool: 30 * 24 * time.Hour, PartnerTimeout: time.Minute}, time.Now())
		done <- err
	}()
	select {
	case <-fault.Paused("purge:before_remove"):
	case <-time.After(30 * time.Second):
		t.Fatal("the purge never came to remove the file's bytes")
	}
	if _, err := r.d.Replay(ctx, intake.ReplayRequest{ID: f.ID, Actor: "test", Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	fault.Resume("purge:before_remove")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !sp.Has("acme", sha, int64(len(data))) {
		t.Fatal("the purge removed the bytes of a replay that began after its decision")
	}
}

// A replay that ends archived is the latest word on its file's rows. The
// replayed file's receipt is published again naming the replay
// (replayed_by), its rows as they were, and its rejects report, which
// lists a row the replay has since applied, is removed; a second replay
// does the same to the first one's receipt. The first replay stops right
// after that receipt is up (a fault), is handed over, and is finished by
// the reconciler's takeover and the next poll, which find the receipt and
// do the step again.
func TestAReplayedFilesReportsGiveWayToTheReplays(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	r := newRig(t, pool, "w1", site)
	if _, err := pool.Exec(ctx, `ALTER TABLE orders ADD CONSTRAINT amount_cap CHECK (amount < 100)`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-1.csv", ordersFile([2]string{"RP-1", "1.00"}, [2]string{"RP-2", "200.00"}))
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	if f.State != "archived" || f.Rejected != 1 || f.Rejects == "" {
		t.Fatalf("%+v: want archived with one row refused by the target and a rejects report", f)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders DROP CONSTRAINT amount_cap`); err != nil {
		t.Fatal(err)
	}
	// the file finished an hour ago, as its ledger row has it: a receipt
	// written again saying now would say another hour
	var finished time.Time
	if err := pool.QueryRow(ctx, `UPDATE file_intake SET finished_at = finished_at - interval '1 hour' WHERE intake_id = $1 RETURNING finished_at`, f.ID).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	if err := fault.Set("publish:replayed receipt=error@2"); err != nil {
		t.Fatal(err)
	}
	m, err := r.d.Replay(ctx, intake.ReplayRequest{ID: f.ID, Actor: "test", Reason: "target fixed"})
	fault.Set("")
	if !errors.Is(err, fault.ErrInjected) || m == nil {
		t.Fatalf("replay: %v, want it stopped by the injected fault after its row", err)
	}
	if rc := receipt(t, site, f.Receipt); rc.ReplayedBy != m.ID {
		t.Fatalf("at the stop the replayed file's receipt is %+v, want it published naming replay %d", rc, m.ID)
	}
	if got := files(t, pool, "acme")[0]; got.Rejects == "" {
		t.Fatalf("at the stop %+v: want its row not yet recorded", got)
	}
	r.reconcileOnce(site)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if rc := receipt(t, site, fs[1].Receipt); fs[1].ID != m.ID || rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Applied != 1 || rc.Rows.Unchanged != 1 {
		t.Fatalf("replay %+v, receipt %+v: want accepted, RP-2 applied and RP-1 unchanged", fs[1], rc)
	}
	orig := fs[0]
	rc := receipt(t, site, orig.Receipt)
	if rc.ReplayedBy != m.ID || rc.Rejects != "" || rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Rejected != 1 || rc.Rows.Applied != 1 {
		t.Fatalf("the replayed file's receipt %+v: want its rows as they were, naming replay %d, no rejects report", rc, m.ID)
	}
	if d := rc.ProcessedAt.Sub(finished); d < -time.Second || d > time.Second {
		t.Fatalf("the replayed file's receipt says it was processed at %s: want when the file was, %s", rc.ProcessedAt, finished)
	}
	if _, err := os.Stat(f.Rejects); !os.IsNotExist(err) || orig.Rejects != "" {
		t.Fatalf("the replayed file's rejects report %s (%v), recorded %q: want it gone", f.Rejects, err, orig.Rejects)
	}
	m2, err := r.d.Replay(ctx, intake.ReplayRequest{ID: f.ID, Actor: "test", Reason: "again"})
	if err != nil {
		t.Fatal(err)
	}
	fs = files(t, pool, "acme")
	for _, e := range fs[:2] {
		if rc := receipt(t, site, e.Receipt); rc.ReplayedBy != m2.ID {
			t.Fatalf("intake %d's receipt %+v: want it naming the latest replay %d", e.ID, rc, m2.ID)
		}
	}
	if got := site.Files(t, "reports"); len(got) != 3 {
		t.Fatalf("reports/ holds %q, want the three receipts alone", got)
	}
}
