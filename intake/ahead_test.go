package intake_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Applying ahead of the plan (ahead.go): a file's chunks go into one
// transaction while it downloads, which commits behind the gate once the
// plan says go and rolls back otherwise. These files are small, so the
// size from which a file is applied ahead is lowered and chunks hold 3
// rows: 20 rows are chunks 0-6, chunk 6 the last (never applied ahead).

const aheadRows = 20

// aheadRig is a partner whose files are applied ahead, with the signal
// of each chunk applied ahead initialised.
func aheadRig(t *testing.T, feed ...func(*partners.Feed)) (*rig, *testenv.Site, *pgxpool.Pool) {
	t.Helper()
	t.Cleanup(intake.SetAheadBytes(1))
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 3
	for _, f := range feed {
		f(&site.Config.Feeds[0])
	}
	r := newRig(t, pool, "w1", site)
	intake.Signals(r.d).AheadChunk.Init(t)
	return r, site, pool
}

func aheadCount(r *rig, result string) float64 {
	return testutil.ToFloat64(r.d.Metrics().Ahead.WithLabelValues("acme", result))
}

// openWriters counts the open transactions of the test's database that
// wrote: the one held open ahead of the plan (idle, or in the COPY that
// its chunks stream into).
func openWriters(t *testing.T, pool *pgxpool.Pool) int64 {
	return count(t, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL`)
}

// openLeft counts the transactions of the test's database a run could
// have left open: those that wrote, and those idle in a transaction
// whatever they did (an apply ahead whose chunks were all unchanged only
// read: it holds no transaction id).
func openLeft(t *testing.T, pool *pgxpool.Pool) int64 {
	return count(t, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		    AND (backend_xid IS NOT NULL OR state LIKE 'idle in transaction%')`)
}

// writersLeft is openLeft once it reaches zero, or after 10 s. A
// transaction whose COPY was cancelled ends when its backend notices its
// connection closed (pgx closes a connection whose statement is
// cancelled): on a loaded machine that takes a moment after the run
// returned, while one left open stays open.
func writersLeft(t *testing.T, pool *pgxpool.Pool) int64 {
	n := openLeft(t, pool)
	gone := make(chan struct{})
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.AfterFunc(10*time.Second, func() { close(gone) })
	defer deadline.Stop()
	for n != 0 {
		select {
		case <-gone:
			return n
		case <-tick.C:
			n = openLeft(t, pool)
		}
	}
	return 0
}

// wantAheadOnce checks that the partner's one apply ahead ended with
// result and left no transaction open.
func wantAheadOnce(t *testing.T, r *rig, pool *pgxpool.Pool, result string) {
	t.Helper()
	if got := aheadCount(r, result); got != 1 {
		t.Fatalf("apply ahead %s %v times, want 1", result, got)
	}
	if n := writersLeft(t, pool); n != 0 {
		t.Fatalf("%d transactions left open", n)
	}
}

// wantNothingWritten checks that no row and no chunk record of the
// partner's files is in.
func wantNothingWritten(t *testing.T, pool *pgxpool.Pool, why string) {
	t.Helper()
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 0 {
		t.Fatalf("%d rows in the target, want none: %s", n, why)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk`); n != 0 {
		t.Fatalf("%d chunk records, want none: %s", n, why)
	}
}

func TestChunksAppliedAheadCommitWithThePlanAndNotBefore(t *testing.T) {
	r, site, pool := aheadRig(t)
	site.Drop(t, "orders-ahead.csv", goodRows("A", aheadRows))
	resume := r.pollPaused("acme", "spool:after") // downloaded and recorded; not planned
	intake.Signals(r.d).AheadChunk.WaitFor(func(no int) bool { return no == 5 })
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 0 {
		t.Fatalf("%d rows visible before the plan, want none", n)
	}
	if n := openWriters(t, pool); n != 1 {
		t.Fatalf("%d open transactions that wrote, want the one applied ahead", n)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	f := files(t, pool, "acme")[0]
	if f.State != "archived" || f.Total != aheadRows || f.Applied != aheadRows || f.Chunks != 7 {
		t.Fatalf("got %+v, want archived with %d rows applied in 7 chunks", f, aheadRows)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND last_intake_id = $1`, f.ID); n != aheadRows {
		t.Fatalf("got %d target rows, want %d", n, aheadRows)
	}
	// chunks 0-5 committed in the one transaction held open ahead, chunk 6
	// in its own
	if n := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM intake_chunk WHERE intake_id = $1`, f.ID); n != 2 {
		t.Fatalf("the 7 chunks committed in %d transactions, want 2 (six ahead, the last alone)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1 AND rows_applied = 3 AND last_line = first_line + 2`, f.ID); n != 6 {
		t.Fatalf("%d chunk records of 3 applied rows over 3 lines, want 6", n)
	}
	wantAheadOnce(t, r, pool, "committed")
}

func TestChunksAppliedAheadRollBackWhenThePlanHoldsTheFile(t *testing.T) {
	r, site, pool := aheadRig(t, func(f *partners.Feed) { f.MaxRejectRatio = 0.2 })
	lines := strings.SplitAfter(goodRows("H", aheadRows), "\n")
	for i := 10; i <= aheadRows; i++ { // rows 10-20 (11 of 20) are rejected
		lines[i] = strings.Replace(lines[i], "@example.com", "", 1)
	}
	site.Drop(t, "orders-held.csv", strings.Join(lines, ""))
	resume := r.pollPaused("acme", "spool:after")
	intake.Signals(r.d).AheadChunk.WaitFor(func(no int) bool { return no == 5 })
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	f := files(t, pool, "acme")[0]
	if f.State != "quarantined" || f.Reason != string(reason.RejectRate) || f.Applied != 0 || f.Chunks != 0 {
		t.Fatalf("got %+v, want quarantined for its reject rate, nothing applied", f)
	}
	wantNothingWritten(t, pool, "the file was held")
	wantAheadOnce(t, r, pool, "rolled_back")
}

func TestChunksAppliedAheadAreFencedAtTheirCommit(t *testing.T) {
	r, site, pool := aheadRig(t)
	site.Drop(t, "orders-fenced.csv", goodRows("F", aheadRows))
	resume := r.pollPaused("acme", "apply:ahead_commit") // planned: applying
	// another worker takes the file over before the chunks applied ahead
	// commit
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET fencing_token = fencing_token + 1 WHERE partner_id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	wantNothingWritten(t, pool, "the worker was fenced off")
	if f := files(t, pool, "acme")[0]; f.State != "applying" || f.Chunks != 0 {
		t.Fatalf("got %+v, want applying with no chunk (the new owner's)", f)
	}
	if n := writersLeft(t, pool); n != 0 {
		t.Fatalf("%d transactions left open", n)
	}
}

func TestChunksAppliedAheadGiveWayWhenLaterKeysExist(t *testing.T) {
	r, site, pool := aheadRig(t)
	lines := strings.SplitAfter(goodRows("K", aheadRows), "\n")
	// keys K-10..K-12 (chunk 3) are in the target already: chunks 0-2 go
	// straight in ahead, chunk 3 is refused, and the file is applied from
	// the spool after its plan instead
	site.Drop(t, "orders-first.csv", lines[0]+strings.Join(lines[10:13], ""))
	r.poll("acme")
	site.Drop(t, "orders-second.csv", strings.Join(lines, ""))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 {
		t.Fatalf("got %d files, want 2", len(fs))
	}
	f := fs[1]
	if f.State != "archived" || f.Applied != aheadRows-3 || f.Unchanged != 3 || f.Chunks != 7 {
		t.Fatalf("got %+v, want archived: %d applied, 3 unchanged, 7 chunks", f, aheadRows-3)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != aheadRows {
		t.Fatalf("got %d target rows, want %d", n, aheadRows)
	}
	if got, c := aheadCount(r, "abandoned"), aheadCount(r, "committed"); got != 1 || c != 1 {
		t.Fatalf("apply ahead abandoned %v and committed %v times, want 1 and 1 (the first file)", got, c)
	}
	if n := writersLeft(t, pool); n != 0 {
		t.Fatalf("%d transactions left open", n)
	}
}

func TestChunksAppliedAheadMergeARepeatedFile(t *testing.T) {
	r, site, pool := aheadRig(t)
	rows := goodRows("M", aheadRows)
	site.Drop(t, "orders-m1.csv", rows)
	r.poll("acme")
	// the same keys again under another batch, three rows changed: every
	// chunk takes the merge path, ahead (the look-up leaves its unchanged
	// rows out: the changed rows alone are staged and merged)
	lines := strings.SplitAfter(rows, "\n")
	for _, i := range []int{4, 11, 17} {
		lines[i] = strings.Replace(lines[i], ",paid,", ",new,", 1)
	}
	site.Drop(t, "orders-m2.csv", strings.Join(lines, ""))
	r.poll("acme")
	fs := files(t, pool, "acme")
	f := fs[len(fs)-1]
	if f.State != "archived" || f.Applied != 3 || f.Unchanged != aheadRows-3 || f.Chunks != 7 {
		t.Fatalf("got %+v, want archived: 3 applied, %d unchanged", f, aheadRows-3)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND status = 'new' AND last_intake_id = $1`, f.ID); n != 3 {
		t.Fatalf("got %d changed rows written by the second file, want 3", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1 AND rows_applied + rows_unchanged = 3`, f.ID); n != 6 {
		t.Fatalf("%d chunk records of the second file account for their 3 rows, want 6", n)
	}
	if got := aheadCount(r, "committed"); got != 2 {
		t.Fatalf("apply ahead committed %v times, want 2", got)
	}
}

func TestAnExactResendAppliedAheadRollsBack(t *testing.T) {
	r, site, pool := aheadRig(t)
	site.Drop(t, "orders-dup.csv", goodRows("D", aheadRows))
	r.poll("acme")
	site.Drop(t, "orders-dup.csv", goodRows("D", aheadRows))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "duplicate" {
		t.Fatalf("got %+v, want the resend a duplicate", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE last_intake_id = $1`, fs[1].ID); n != 0 {
		t.Fatalf("%d rows written by a duplicate, want none", n)
	}
	if got, rb := aheadCount(r, "committed"), aheadCount(r, "rolled_back"); got != 1 || rb != 1 {
		t.Fatalf("apply ahead committed %v and rolled back %v times, want 1 and 1", got, rb)
	}
}

func TestChunksAppliedAheadStreamIntoCopyTextAndGuardedTargets(t *testing.T) {
	for _, tc := range []struct{ name, ddl string }{
		// double precision has no binary encoder: the chunks stream as
		// COPY text, without the binary header and trailer
		{"copy text", `CREATE TABLE orders_ahead (
			partner_id text NOT NULL, order_id text NOT NULL, email text, amount double precision NOT NULL,
			status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL,
			PRIMARY KEY (partner_id, order_id))`},
		// guarded: every streamed row carries intake's hash of it
		{"guarded", `CREATE TABLE orders_ahead (
			partner_id text NOT NULL, order_id text NOT NULL, email text, amount numeric(12,2) NOT NULL,
			status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL,
			intake_row_hash bigint, PRIMARY KEY (partner_id, order_id))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(intake.SetAheadBytes(1))
			_, pool := testenv.DB(t)
			if _, err := pool.Exec(context.Background(), tc.ddl); err != nil {
				t.Fatal(err)
			}
			site := testenv.NewSite(t, "acme")
			site.Config.Feeds[0].ChunkRows = 3
			site.Config.Feeds[0].Target = "orders_ahead"
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-a1.csv", goodRows("T", aheadRows))
			r.poll("acme")
			// the same rows again, one changed: all merged, none an edit
			// made outside intake
			lines := strings.SplitAfter(goodRows("T", aheadRows), "\n")
			lines[9] = strings.Replace(lines[9], ",paid,", ",new,", 1)
			site.Drop(t, "orders-a2.csv", strings.Join(lines, ""))
			r.poll("acme")
			fs := files(t, pool, "acme")
			if len(fs) != 2 || fs[0].Applied != aheadRows || fs[1].Applied != 1 || fs[1].Unchanged != aheadRows-1 || fs[1].Confl != 0 {
				t.Fatalf("got %+v, want %d applied, then 1 applied and %d unchanged", fs, aheadRows, aheadRows-1)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders_ahead WHERE partner_id = 'acme'`); n != aheadRows {
				t.Fatalf("got %d target rows, want %d", n, aheadRows)
			}
			if got := aheadCount(r, "committed"); got != 2 {
				t.Fatalf("apply ahead committed %v times, want 2", got)
			}
		})
	}
}

func TestChunksAppliedAheadCountEachChunksOwnRows(t *testing.T) {
	// insert_only: an existing key is a conflict (exists)
	r, site, pool := aheadRig(t, func(f *partners.Feed) { f.Mode = partners.ModeInsertOnly })
	rows := strings.SplitAfter(goodRows("E", 9), "\n")
	held := strings.ReplaceAll(rows[1]+strings.Join(rows[4:7], ""), ",paid,", ",new,") // other values: not unchanged
	site.Drop(t, "orders-e1.csv", rows[0]+held)
	r.poll("acme")
	// chunk 0 (E-1 held, E-2 twice) is merged for its repeated key; chunk
	// 1 (E-4..E-6, all held) is tried straight in under the savepoint,
	// refused, and merged: only its own rows, not chunk 0's again; chunk 2
	// (E-7..E-9) is new
	site.Drop(t, "orders-e2.csv", rows[0]+rows[1]+rows[2]+rows[2]+strings.Join(rows[4:10], ""))
	r.poll("acme")
	fs := files(t, pool, "acme")
	f := fs[len(fs)-1]
	if f.State != "archived" || f.Total != 9 || f.Applied != 4 || f.Confl != 4 || f.Rejected != 1 || f.Unchanged != 0 {
		t.Fatalf("got %+v, want 9 rows: 4 applied, 4 conflicts (exists), 1 rejected (duplicate_key)", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1 AND reason = 'exists'`, f.ID); n != 4 {
		t.Fatalf("%d rows recorded as existing, want 4", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1 AND chunk_no = 1 AND rows_conflict = 3 AND rows_unchanged = 0`, f.ID); n != 1 {
		t.Fatal("chunk 1's record does not hold its own 3 conflicts")
	}
	if got := aheadCount(r, "committed"); got != 2 {
		t.Fatalf("apply ahead committed %v times, want 2", got)
	}
}

func TestASnapshotAppliedAheadSweepsOnlyKeysItLacks(t *testing.T) {
	r, site, pool := aheadRig(t, func(f *partners.Feed) {
		f.Mode = partners.ModeSnapshot
		f.DeleteGuard = &partners.DeleteGuard{Off: true} // a guarded snapshot is planned before it applies
	})
	site.Drop(t, "orders-s1.csv", goodRows("S", aheadRows))
	r.poll("acme")
	// the partner's set again without S-16..S-20: each chunk's keys are
	// recorded ahead, from the staging table as that chunk left it, and
	// the last chunk sweeps the five keys no chunk recorded
	site.Drop(t, "orders-s2.csv", goodRows("S", aheadRows-5))
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[1].State != "archived" || fs[1].Unchanged != aheadRows-5 {
		t.Fatalf("got %+v, want the second snapshot archived with %d rows unchanged", fs, aheadRows-5)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != aheadRows-5 {
		t.Fatalf("got %d target rows, want %d (five swept)", n, aheadRows-5)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND order_id IN ('S-16', 'S-20')`); n != 0 {
		t.Fatal("a key the snapshot lacks is still in the target")
	}
	if n := count(t, pool, `SELECT sum(rows_deleted) FROM file_intake WHERE intake_id = $1`, fs[1].ID); n != 5 {
		t.Fatalf("the second snapshot deleted %d rows, want 5", n)
	}
	if got := aheadCount(r, "committed"); got != 2 {
		t.Fatalf("apply ahead committed %v times, want 2", got)
	}
}

func TestRowsRefusedAheadAreRejectedWithTheirLines(t *testing.T) {
	r, site, pool := aheadRig(t)
	lines := strings.SplitAfter(goodRows("V", aheadRows), "\n")
	// line 3 (chunk 0) fails validation; line 9 (chunk 2) holds a qty the
	// target's integer column cannot take (refused while encoding)
	lines[2] = strings.Replace(lines[2], "@example.com", "", 1)
	lines[8] = strings.TrimSuffix(lines[8], "8\n") + "99999999999\n"
	site.Drop(t, "orders-v.csv", strings.Join(lines, ""))
	planned := intake.RejectsFromPlan()
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	if f.State != "archived" || f.Total != aheadRows || f.Applied != aheadRows-2 || f.Rejected != 2 {
		t.Fatalf("got %+v, want archived: %d applied, 2 rejected", f, aheadRows-2)
	}
	got := testenv.Strings(t, pool, `SELECT line || ':' || reason FROM intake_row_issue WHERE intake_id = $1 ORDER BY line`, f.ID)
	if strings.Join(got, ",") != "3:bad_email,9:"+string(reason.TargetRefused) {
		t.Fatalf("row issues %v, want line 3 bad_email and line 9 %s", got, reason.TargetRefused)
	}
	// the plan knew of line 3 alone: the report is the ledger's, both lines
	rel, _ := filepath.Rel(site.Root, f.Rejects)
	report := site.Read(t, rel)
	if !strings.Contains(report, "\n3,email,bad_email,rejected,\n") || !strings.Contains(report, "\n9,qty,"+string(reason.TargetRefused)+",rejected,") {
		t.Fatalf("rejects report:\n%s\nwant lines 3 and 9", report)
	}
	if n := intake.RejectsFromPlan() - planned; n != 0 {
		t.Fatalf("%d rejects reports rendered from the plan, want 0: the apply rejected a row the plan did not", n)
	}
	if got := aheadCount(r, "committed"); got != 1 {
		t.Fatalf("apply ahead committed %v times, want 1", got)
	}
}

// A plan that records rejected rows waits for a connection like any other
// statement when the work pool is full (here: the apply ahead's and the
// others, which the test holds, as other files' transactions waiting on
// the rows the apply ahead wrote would). The apply ahead then gives its
// connection up (pool_busy) so the plan it waits for can start, and the
// file is applied from the spool.
func TestAnApplyAheadGivesItsConnectionUpToItsPlanWaitingForOne(t *testing.T) {
	t.Cleanup(intake.SetAheadBytes(1))
	url, pool := testenv.DB(t)
	// room for the apply ahead to start (it never takes the pool's last
	// two connections) whatever the poll holds at that moment
	work := testenv.PoolWith(t, url, func(pc *pgxpool.Config) {
		pc.MaxConns = 4
		pc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName("w1")
	})
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 3
	r := newRig(t, work, "w1", site)
	intake.Signals(r.d).AheadChunk.Init(t)
	lines := strings.SplitAfter(goodRows("P", aheadRows), "\n")
	lines[2] = strings.Replace(lines[2], "@example.com", "", 1) // line 3 rejected
	site.Drop(t, "orders-p.csv", strings.Join(lines, ""))
	resume := r.pollPaused("acme", "spool:after", "plan:rejected_conn")
	intake.Signals(r.d).AheadChunk.WaitFor(func(no int) bool { return no == 5 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var held []*pgxpool.Conn // every connection but the apply ahead's
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	hold := func() {
		c, err := work.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// all but one: the pool is not full, and the apply ahead holds on
	for range work.Stat().MaxConns() - 2 {
		hold()
	}
	done := make(chan error, 1)
	go func() { done <- resume() }()
	select {
	case <-fault.Paused("plan:rejected_conn"):
	case <-ctx.Done():
		t.Fatal("the plan never came to record its rejected rows")
	}
	// the last one: from now on the plan waits for a connection, which
	// is the apply ahead's to give up
	hold()
	fault.Resume("plan:rejected_conn")
	testenv.WaitFor(t, time.Minute, func() bool { return aheadCount(r, "abandoned") == 1 },
		testenv.Says("the apply ahead kept its connection while its plan waited for one"))
	for _, c := range held {
		c.Release()
	}
	held = nil
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f := files(t, pool, "acme")[0]
	if f.State != "archived" || f.Applied != aheadRows-1 || f.Rejected != 1 {
		t.Fatalf("got %+v, want archived: %d applied, 1 rejected", f, aheadRows-1)
	}
	if got := aheadCount(r, "committed"); got != 0 {
		t.Fatalf("apply ahead committed %v times, want 0 (it gave its connection up)", got)
	}
}

// Two snapshots of one feed in one poll, the newer applied ahead while it
// downloads, the older from its spool: the apply ahead takes the feed's
// snapshot lock and asks whether a newer one has begun, as every chunk
// does, so the older never commits after the newer has begun. Here the
// newer holds its chunks ahead, waiting at its commit; the older either
// finished first (it was applied before the newer began) or waits for the
// lock and then finds itself superseded. Either way the table ends as
// the newer snapshot says: all its rows, with its values. Before, the
// apply ahead held no lock: the older applied in full meanwhile (its
// values, its sweep of the newer's keys) and the newer's chunks, judged
// unchanged before the older wrote, never put them back.
func TestSnapshotsAppliedAheadKeepTheirOrder(t *testing.T) {
	r, site, pool := aheadRig(t, func(f *partners.Feed) {
		f.Mode = partners.ModeSnapshot
		f.DeleteGuard = &partners.DeleteGuard{Off: true}
	})
	site.Drop(t, "orders-s0.csv", goodRows("S", aheadRows))
	r.poll("acme")
	older := strings.ReplaceAll(goodRows("S", aheadRows-5), ",paid,", ",shipped,")
	newer := goodRows("S", aheadRows) // the same as S0: every row unchanged
	t.Cleanup(intake.SetAheadBytes(int64(len(newer))))
	site.Drop(t, "orders-s1.csv", older)
	site.Drop(t, "orders-s2.csv", newer)
	resume := r.pollPaused("acme", "apply:ahead_commit")
	waitUntil(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM file_intake WHERE remote_name = 'orders-s1.csv' AND state = 'archived'`) == 1 ||
			count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory'`) > 0
	})
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 3 || fs[2].Name != "orders-s2.csv" || fs[2].State != "archived" || fs[2].Reason != "" {
		t.Fatalf("files %+v, want the newest snapshot archived", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND status = 'paid'`); n != aheadRows {
		t.Fatalf("%d of the newest snapshot's %d rows are in the target with its values", n, aheadRows)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != aheadRows {
		t.Fatalf("the target holds %d rows, want the newest snapshot's %d", n, aheadRows)
	}
}
