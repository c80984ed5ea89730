package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// The poison matrix (docs/failure-matrix.md, "Poison"): values the feed
// accepts and the target refuses, files that fail again and again, and
// errors that no retry mends. None of them holds up the partner's next
// file, and none of their values reaches a log, a receipt or a report.

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

type rowIssue struct {
	line                   int64
	column, outcome, codes string
	reason                 reason.Code
}

func rowIssues(t *testing.T, pool *pgxpool.Pool, id int64) map[int64]rowIssue {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT line, coalesce(column_name, ''), reason, outcome, coalesce(detail, '')
		FROM intake_row_issue WHERE intake_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[int64]rowIssue{}
	for rs.Next() {
		var r rowIssue
		if err := rs.Scan(&r.line, &r.column, &r.reason, &r.outcome, &r.codes); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[r.line]; dup {
			t.Fatalf("line %d has two issues", r.line)
		}
		out[r.line] = r
	}
	return out
}

// Each class of value the target refuses — length, numeric overflow, not
// null, check, foreign key, a second unique index, and a value the
// column's binary encoding refuses — rejects exactly its row with reason
// target_refused and the SQLSTATE, in a fresh file (rows first tried
// straight into the target) and in a file over existing keys (the merge),
// across chunks; every other row applies, totals reconcile, and the
// partner's next file lands behind it.
func TestValuesTheTargetRefusesRejectExactlyTheirRows(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `CREATE TABLE order_status (status text PRIMARY KEY);
		INSERT INTO order_status VALUES ('new'), ('paid');
		ALTER TABLE orders ALTER email TYPE varchar(24), ALTER amount TYPE numeric(6,2),
		    ALTER qty TYPE smallint, ALTER qty SET NOT NULL,
		    ADD CONSTRAINT qty_positive CHECK (qty > 0),
		    ADD CONSTRAINT status_known FOREIGN KEY (status) REFERENCES order_status;
		CREATE UNIQUE INDEX orders_email ON orders (partner_id, email)`)
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 4
	site.Config.Feeds[0].MaxRejectRatio = 0.9
	row := func(id, email, amount, status, qty string) string {
		return fmt.Sprintf("%s,%s,%s,%s,2026-11-01T10:00:00Z,%s\n", id, email, amount, status, qty)
	}
	secret := "SECRET-VALUE-7f3a"
	body := testenv.OrdersHeader +
		row("P-1", "a1@example.com", "1.00", "paid", "1") + // line 2
		row("P-2", strings.ToLower(secret)+"-much-too-long@example.com", "1.00", "paid", "1") + // 3: varchar(24) 22001
		row("P-3", "a3@example.com", "12345.00", "paid", "1") + // 4: numeric(6,2) 22003
		row("P-4", "a4@example.com", "1.00", "paid", "") + // 5: NOT NULL 23502
		row("P-5", "a5@example.com", "1.00", "paid", "-3") + // 6: CHECK 23514
		row("P-6", "a6@example.com", "1.00", "shipped", "1") + // 7: foreign key 23503
		row("P-7", "a1@example.com", "1.00", "paid", "1") + // 8: second unique index 23505
		row("P-8", "a8@example.com", "1.00", "paid", "40000") + // 9: smallint: the binary encoder refuses
		row("P-9", "a9@example.com", "1.00", "paid", "2") + // 10
		row("P-10", "a10@example.com", "1.00", "new", "3") // 11
	site.Drop(t, "orders-a-refused.csv", body)
	site.Drop(t, "orders-b-next.csv", testenv.OrdersCSV("N", 3))

	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 2 {
		t.Fatalf("files %+v", fs)
	}
	f := fs[0]
	if f.State != "archived" || f.Total != 10 || f.Applied != 3 || f.Rejected != 7 || f.Applied+f.Rejected+f.Unchanged+f.Confl != f.Total {
		t.Fatalf("refused file: %+v, want archived with 3 applied and 7 rejected", f)
	}
	if fs[1].State != "archived" || fs[1].Applied != 3 {
		t.Fatalf("the partner's next file: %+v", fs[1])
	}
	want := map[int64]struct{ column, code string }{
		3: {"email", "22001"}, 4: {"amount", "22003"}, 5: {"qty", "23502"}, 6: {"", "23514"},
		7: {"", "23503"}, 8: {"", "23505"}, 9: {"qty", ""},
	}
	got := rowIssues(t, pool, f.ID)
	if len(got) != len(want) {
		t.Fatalf("row issues %+v, want lines %v", got, want)
	}
	for line, w := range want {
		g := got[line]
		if g.reason != reason.TargetRefused || g.outcome != "rejected" || !strings.Contains(g.codes, w.code) ||
			(w.column != "" && g.column != w.column) {
			t.Errorf("line %d: %+v, want target_refused on column %q with SQLSTATE %q", line, g, w.column, w.code)
		}
	}
	for _, c := range []string{"qty_positive", "status_known", "orders_email"} {
		found := false
		for _, g := range got {
			found = found || strings.Contains(g.codes, c)
		}
		if !found {
			t.Errorf("no row issue names constraint %s: %+v", c, got)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme' AND order_id IN ('P-1', 'P-9', 'P-10')`); n != 3 {
		t.Fatalf("%d of the 3 good rows applied", n)
	}
	rc := receipt(t, site, f.Receipt)
	if rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Rejected != 7 {
		t.Fatalf("receipt %+v", rc)
	}
	rejects := site.Read(t, relTo(t, site, f.Rejects))
	if !strings.Contains(rejects, "3,email,target_refused,rejected,SQLSTATE 22001") {
		t.Fatalf("rejects report:\n%s", rejects)
	}
	if strings.Contains(strings.ToLower(rejects), strings.ToLower(secret)) {
		t.Fatal("the rejects report quotes a refused value")
	}

	// the same file under a new batch over the keys now held: the merge
	// path refuses the same rows and judges the others as it always does
	site.Drop(t, "orders-c-again.csv", strings.ReplaceAll(body, "P-10,a10@example.com,1.00", "P-10,a10@example.com,2.00"))
	r.poll("acme")
	f = files(t, pool, "acme")[2]
	if f.State != "archived" || f.Rejected != 7 || f.Applied != 1 || f.Unchanged != 2 {
		t.Fatalf("the file over held keys: %+v, want 7 refused, 1 applied (P-10's new amount), 2 unchanged", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id = 'P-10' AND amount = 2.00`); n != 1 {
		t.Fatal("P-10's new amount did not land")
	}
}

// A small file whose value the target refuses (a CHECK) leaves its group,
// with the group's files after it so that the files still write in
// intake id order, and goes on alone, where the refused row is rejected
// as on the per-file path; the files before it commit together, a fresh
// group and a group over keys the target holds alike: the group's
// transaction does not fail for one file's value.
func TestARefusedValueSendsItsFileOutOfTheGroup(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `ALTER TABLE orders ADD CONSTRAINT qty_small CHECK (qty < 1000)`)
	site := testenv.NewSite(t, "grr")
	row := func(id string, qty int) string {
		return fmt.Sprintf("%s,%s@example.com,1.00,paid,2026-11-01T10:00:00Z,%d\n", id, strings.ToLower(id), qty)
	}
	r := newRig(t, pool, "w1", site)
	for round, rows := range []string{"fresh", "held"} {
		site.Drop(t, "orders-"+rows+"-1.csv", testenv.OrdersHeader+row("A-1", 1)+row("A-2", 2))
		site.Drop(t, "orders-"+rows+"-2.csv", testenv.OrdersHeader+row("B-1", 1)+row("B-2", 5000)+row("B-3", 3)) // B-2 refused
		site.Drop(t, "orders-"+rows+"-3.csv", testenv.OrdersHeader+row("C-1", round+1)+row("B-1", 7+round))      // B-1 after file 2
		r.poll("grr")
		for reason, want := range map[string]int{intake.LeftRefused: round + 1, intake.LeftAfterRefused: round + 1, intake.LeftGroupFailed: 0} {
			if got := grouped(r, "grr", reason); got != float64(want) {
				t.Fatalf("%s: %v files left their group as %s, want %d", rows, got, reason, want)
			}
		}
		m := byName(files(t, pool, "grr"))
		f1, f2, f3 := m["orders-"+rows+"-1.csv"], m["orders-"+rows+"-2.csv"], m["orders-"+rows+"-3.csv"]
		if f1.State != "archived" || f1.Applied+f1.Unchanged != 2 || f1.Rejected != 0 || f3.State != "archived" || f3.Applied != 2 || f3.Confl != 0 {
			t.Fatalf("%s: the group's other files: %+v, %+v", rows, f1, f3)
		}
		if f2.State != "archived" || f2.Rejected != 1 || f2.Confl != 0 || f2.Applied+f2.Unchanged != 2 || receipt(t, site, f2.Receipt).Outcome != ledger.OutcomeAcceptedWithRejects {
			t.Fatalf("%s: the file with the refused value: %+v", rows, f2)
		}
		if g := rowIssues(t, pool, f2.ID)[3]; g.reason != reason.TargetRefused || !strings.Contains(g.codes, "23514") {
			t.Fatalf("%s: line 3's issue %+v, want target_refused 23514", rows, g)
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'grr' AND order_id = 'B-1' AND qty = $1`, 7+round); n != 1 {
			t.Fatalf("%s: B-1 does not hold file 3's value", rows) // and file 2 met no newer write (Confl 0): id order
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'grr'`); n != 5 {
		t.Fatalf("the target holds %d rows of the partner, want 5 (B-2 never)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'grr' AND order_id = 'C-1' AND qty = 2`); n != 1 {
		t.Fatal("the held round's C-1 did not land its new qty")
	}
}

// A chunk that the target refuses row after row (a mapping that does not
// fit its table) fails the file for good with target_refused once the
// bounded search gives up, and the partner's next file lands.
func TestAMappingTheTargetRefusesEverywhereFailsTheFileNotThePartner(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `ALTER TABLE orders ALTER order_id TYPE varchar(3)`)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-a-long-keys.csv", testenv.OrdersCSV("LONGKEY", 200))
	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "failed_terminal" || fs[0].Reason != string(reason.TargetRefused) {
		t.Fatalf("files %+v, want failed_terminal target_refused", fs)
	}
	rc := receipt(t, site, fs[0].Receipt)
	if rc.Outcome != ledger.OutcomeFailed || rc.Reason != reason.TargetRefused || strings.Contains(rc.Detail, "LONGKEY") {
		t.Fatalf("receipt %+v", rc)
	}
	// failed for good, it waits for ops as a quarantined file does: status
	// counts it open, and the reconciler names it for a human
	ctx := context.Background()
	if st, err := ops.Status(ctx, pool, []string{"acme"}); err != nil || st[0].QuarantineOpen != 1 {
		t.Fatalf("status %+v, %v: want the failed file open for a decision", st, err)
	}
	r.reconcileOnce(site)
	found, err := ledger.StoredFindings(ctx, pool, []string{"acme"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(found, func(f ledger.Finding) bool {
		return f.Kind == ledger.KindQuarantined && f.IntakeID == fs[0].ID && f.NeedsHuman
	}) {
		t.Fatalf("findings %+v: want the failed file waiting for ops", found)
	}
	site.Drop(t, "orders-b-short.csv", "order_id,email,amount,status,placed_at,qty\nS-1,a@b.io,1.00,paid,2026-11-01T10:00:00Z,1\n")
	r.poll("acme")
	if fs := files(t, pool, "acme"); len(fs) != 2 || fs[1].State != "archived" || fs[1].Applied != 1 {
		t.Fatalf("the partner's next file: %+v", fs)
	}
}

// A file whose apply fails transiently every time is retried on its own
// backoff while the partner's later files land; past its retry budget it
// fails for good with retries_exhausted and a receipt. An error no retry
// mends (a trigger raising a plain exception) fails its file at once.
func TestAFailingFileNeverHoldsUpThePartner(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF NEW.order_id LIKE 'BUSY-%' THEN RAISE EXCEPTION 'busy' USING ERRCODE = '40001'; END IF;
		    IF NEW.order_id LIKE 'BROKEN-%' THEN RAISE EXCEPTION 'broken %', NEW.email; END IF;
		    RETURN NEW;
		END $$;
		CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION poison()`)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-a-busy.csv", testenv.OrdersCSV("BUSY", 2))
	site.Drop(t, "orders-b-broken.csv", testenv.OrdersCSV("BROKEN", 2))
	site.Drop(t, "orders-c-fine.csv", testenv.OrdersCSV("FINE", 2))
	// a file whose first chunk applies and whose second fails every time
	head, half := rowsOf(testenv.OrdersCSV("HALF", 2))
	_, busy := rowsOf(testenv.OrdersCSV("BUSY-H", 2))
	site.Drop(t, "orders-d-half.csv", head+strings.Join(append(half, busy...), ""))
	site.Config.Feeds[0].ChunkRows = 2
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 3, Base: time.Millisecond, Max: time.Millisecond}}, site)

	r.poll("acme") // the poll itself succeeds: a file's failure is the file's
	byName := func() map[string]fileRow {
		out := map[string]fileRow{}
		for _, f := range files(t, pool, "acme") {
			out[f.Name] = f
		}
		return out
	}
	fs := byName()
	if f := fs["orders-c-fine.csv"]; f.State != "archived" || f.Applied != 2 {
		t.Fatalf("the file behind the failing ones: %+v", f)
	}
	if f := fs["orders-b-broken.csv"]; f.State != "failed_terminal" || f.Reason != string(reason.TargetError) {
		t.Fatalf("a final error: %+v, want failed_terminal target_error at once", f)
	}
	if f := fs["orders-a-busy.csv"]; f.State != "applying" {
		t.Fatalf("a transient failure: %+v, want applying, waiting for its next attempt", f)
	}
	var attempts int
	var lastErr string
	if err := pool.QueryRow(context.Background(), `SELECT attempts, last_error FROM file_intake WHERE remote_name = 'orders-a-busy.csv'`).
		Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || !strings.Contains(lastErr, "SQLSTATE 40001") || strings.Contains(lastErr, "busy") {
		t.Fatalf("attempts %d, last_error %q: want 1 and the SQLSTATE without PostgreSQL's text", attempts, lastErr)
	}
	for range 2 {
		waitDue(t, pool, "acme")
		r.poll("acme")
	}
	f := byName()["orders-a-busy.csv"]
	if f.State != "failed_terminal" || f.Reason != string(reason.RetriesExhausted) {
		t.Fatalf("after its budget: %+v, want failed_terminal retries_exhausted", f)
	}
	rc := receipt(t, site, f.Receipt)
	if rc.Outcome != ledger.OutcomeFailed || rc.Reason != reason.RetriesExhausted ||
		!strings.Contains(rc.Detail, "SQLSTATE 40001") || strings.Contains(rc.Detail, "busy") {
		t.Fatalf("receipt %+v: want failed retries_exhausted, the SQLSTATE and nothing of the error's text", rc)
	}
	// the receipt of a file part applied says its applied rows stay
	half2 := byName()["orders-d-half.csv"]
	if rc := receipt(t, site, half2.Receipt); half2.State != "failed_terminal" || half2.Applied != 2 ||
		!strings.Contains(rc.Detail, "2 of its rows were applied before it stopped and stay applied") {
		t.Fatalf("a file past its budget with a chunk applied: %+v, receipt %+v; want its applied rows told", half2, rc)
	}
	// an error of intake's own (a key file, a spool path, a database
	// address) says nothing of itself to the partner: ops have the log
	if got := intake.LastCodes(errors.New("pgp key file /etc/intake/pgp/acme.asc: cannot be unlocked")); got != "" {
		t.Fatalf("a receipt would say %q of an internal error", got)
	}
	broken := receipt(t, site, byName()["orders-b-broken.csv"].Receipt)
	if !strings.Contains(broken.Detail, "SQLSTATE P0001") || strings.Contains(broken.Detail, "example.com") {
		t.Fatalf("the final error's receipt %+v: want the SQLSTATE and no value", broken)
	}
}

func relTo(t *testing.T, s *testenv.Site, p string) string {
	t.Helper()
	rel, err := filepath.Rel(s.Root, p)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// A chunk that takes longer than the lease (here a trigger sleeps over
// three leases of 3 s) is neither taken over nor ended while its owner's replica
// is alive: takeovers tried all through it are refused, the chunk
// commits, the lease is renewed from the commit, and the file is archived
// by its owner under its first fencing token.
func TestAChunkLongerThanTheLeaseIsNotTakenOver(t *testing.T) {
	url, admin := testenv.DB(t)
	lease := 3 * time.Second
	// the daemon's own pool: statement timeout equal to the lease, and the
	// application name by which a takeover ends a stalled owner
	pc, err := intake.PoolConfig(url, "w1", lease)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	exec(t, admin, `CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(10); RETURN NULL; END $$;
		CREATE TRIGGER slow AFTER INSERT ON orders FOR EACH STATEMENT EXECUTE FUNCTION slow()`)
	// the owner's replica is alive: it heartbeats in intake_worker
	exec(t, pool, `INSERT INTO intake_worker (worker_id, hostname, pid, lease, partners, last_seen)
		VALUES ('w1', 'test', 1, '1 hour', '{acme}', now())`)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-slow.csv", testenv.OrdersCSV("S", 5))
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: lease, SpoolMinFree: 1}, site)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := ledger.New(admin, lease)
	tried := make(chan int, 1)
	go func() {
		n := 0
		defer func() { tried <- n }()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			exp, err := l.Expired(ctx, "acme")
			if err != nil {
				return
			}
			for _, old := range exp {
				n++
				var took *ledger.Intake
				_ = l.InClaimSection(ctx, "acme", func(c *ledger.ClaimLock) error {
					var err error
					took, err = c.TakeOver(ctx, l, old, "thief", old.ClaimedPath+".thief")
					return err
				})
				if took != nil {
					t.Errorf("intake %d was taken over while its owner's chunk ran", old.ID)
					return
				}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	r.poll("acme")
	cancel()
	if n := <-tried; n == 0 {
		t.Fatal("no takeover was tried while the chunk ran: the test proves nothing")
	}
	fs := files(t, pool, "acme")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Worker != "w1" || fs[0].Applied != 5 {
		t.Fatalf("files %+v, want archived by w1 with 5 rows", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE fencing_token <> 1`); n != 0 {
		t.Fatal("the file's fencing token moved")
	}
}

// Small files go through in groups (group.go); a value the target refuses
// in one of them makes that file leave its group and take the per-file
// path, where exactly its row is refused; the group's other files apply.
func TestARefusedValueInASmallFileLeavesItsGroup(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `ALTER TABLE orders ALTER email TYPE varchar(20)`)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-g1.csv", testenv.OrdersCSV("G1", 2))
	site.Drop(t, "orders-g2.csv", testenv.OrdersHeader+
		"G2-1,a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n"+
		"G2-2,much-too-long-for-twenty@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n")
	site.Drop(t, "orders-g3.csv", testenv.OrdersCSV("G3", 2))
	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	fs := files(t, pool, "acme")
	if len(fs) != 3 {
		t.Fatalf("files %+v", fs)
	}
	for _, f := range fs {
		want := int64(0)
		if f.Name == "orders-g2.csv" {
			want = 1
		}
		if f.State != "archived" || f.Rejected != want || f.Applied != 2-want {
			t.Fatalf("%s: %+v, want archived with %d refused", f.Name, f, want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 5 {
		t.Fatalf("%d rows, want the 5 the target takes", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id = 'G2-2'`); n != 0 {
		t.Fatal("the refused row landed")
	}
}

// A file that failed for good part way through (its retries exhausted
// after two of its three chunks) and is released after the fix starts over
// as a whole, with a fresh retry budget: every row is accounted for once
// (rows it wrote before count as unchanged, the row the target refuses is
// rejected again), its totals reconcile and its receipt says so.
func TestAReleasedFileThatFailedPartWayIsAppliedWhole(t *testing.T) {
	pool, site, r, f := failedPartWay(t)
	if f.State != "failed_terminal" || f.Reason != string(reason.RetriesExhausted) || f.Chunks != 2 {
		t.Fatalf("%+v: want failed_terminal retries_exhausted after 2 chunks", f)
	}

	exec(t, pool, `DELETE FROM poison_on`) // the fix
	ctx := context.Background()
	if err := ops.Release(ctx, pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "target fixed",
		Partners: []string{"acme"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT attempts FROM file_intake WHERE intake_id = $1`, f.ID).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("a released file keeps %d attempts, want a fresh budget", attempts)
	}
	r.reconcileOnce(site)
	r.poll("acme")
	f = files(t, pool, "acme")[0]
	if f.State != "archived" || f.Total != 6 || f.Applied != 2 || f.Unchanged != 3 || f.Rejected != 1 || f.Confl != 0 || f.Chunks != 3 {
		t.Fatalf("%+v: want archived, 6 = 2 applied + 3 unchanged + 1 rejected, 3 chunks", f)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1`, f.ID); n != 1 {
		t.Fatalf("%d row issues, want the one refused row", n)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'acme'`); n != 5 {
		t.Fatalf("%d rows in the target, want 5", n)
	}
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Total != 6 || rc.Rows.Rejected != 1 {
		t.Fatalf("receipt %+v", rc)
	}
}

// What a released or discarded file leaves on the partner's site is the
// latest decision alone. A file fails part way (retries exhausted after
// two chunks, one row refused by a CHECK): its receipt says failed and a
// rejects report lists the refused row.
//   - Released once both causes are fixed, it applies whole with no row
//     refused: the receipt says accepted, and the earlier rejects report
//     is gone (it would list a row as rejected beside rows.rejected 0).
//   - Discarded instead, its receipt says discarded and that the rows its
//     committed chunks applied stay applied (not "nothing of it was
//     applied"), and it replaces the failed receipt rather than standing
//     beside it.
func TestAReleasedOrDiscardedFileLeavesNoStaleReport(t *testing.T) {
	for _, decision := range []string{"release", "discard"} {
		t.Run(decision, func(t *testing.T) {
			pool, site, r, f := failedPartWay(t)
			if f.State != "failed_terminal" || f.Chunks != 2 || f.Rejects == "" {
				t.Fatalf("%+v: want failed_terminal after 2 chunks with a rejects report", f)
			}
			rejects, _ := filepath.Rel(site.Root, f.Rejects)
			site.Read(t, rejects) // published
			reports := func() []string {
				var out []string
				for _, n := range site.Files(t, "reports") {
					if strings.Contains(n, fmt.Sprintf(".%d.", f.ID)) || strings.Contains(n, fmt.Sprintf("-%d.", f.ID)) {
						out = append(out, n)
					}
				}
				return out
			}
			ctx := context.Background()
			d := ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "reviewed", Partners: []string{"acme"}, Worker: intake.OpsWorker("ops")}
			if decision == "discard" {
				if err := ops.Discard(ctx, pool, d); err != nil {
					t.Fatal(err)
				}
				if err := ops.PublishDecision(ctx, pool, []partners.Config{site.Validated(t)}, f.ID); err != nil {
					t.Fatal(err)
				}
				f = files(t, pool, "acme")[0]
				rc := receipt(t, site, f.Receipt)
				if f.State != "discarded" || rc.Outcome != ledger.OutcomeDiscarded || rc.Rows.Applied != 3 ||
					!strings.Contains(rc.Detail, "3 of its rows were in the target") || strings.Contains(rc.Detail, "nothing of it") {
					t.Fatalf("%+v, receipt %+v: want discarded, saying its 3 applied rows stay", f, rc)
				}
				if got := reports(); len(got) != 2 || !slices.Contains(got, filepath.Base(f.Receipt)) || !slices.Contains(got, filepath.Base(rejects)) {
					t.Fatalf("reports of the file: %q, want the discard's receipt (in the failed one's place) and the rejects report", got)
				}
				return
			}
			exec(t, pool, `DELETE FROM poison_on; ALTER TABLE orders DROP CONSTRAINT not_p1`) // both fixed
			if err := ops.Release(ctx, pool, d); err != nil {
				t.Fatal(err)
			}
			r.reconcileOnce(site)
			r.poll("acme")
			f = files(t, pool, "acme")[0]
			if f.State != "archived" || f.Rejected != 0 || f.Rejects != "" {
				t.Fatalf("%+v: want archived with no row rejected and no rejects report", f)
			}
			if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.Rows.Rejected != 0 || rc.Rejects != "" {
				t.Fatalf("receipt %+v", rc)
			}
			if got := reports(); len(got) != 1 || got[0] != filepath.Base(f.Receipt) {
				t.Fatalf("reports of the file: %q, want its receipt alone (the earlier rejects report removed)", got)
			}
		})
	}
}

// A file that failed part way, released, and held again before any chunk
// of its run after the release applied (its header no longer reads with
// the feed as it is now): a release starts the file over, its counts
// cleared, yet the rows its first run applied stand. The hold's receipt
// says so (rows.applied_before_release), and so does its discard, rather
// than that nothing of it was applied.
func TestAFileHeldAgainAfterItsReleaseSaysWhatItsEarlierRunApplied(t *testing.T) {
	pool, site, r, f := failedPartWay(t)
	if f.State != "failed_terminal" || f.Applied != 3 {
		t.Fatalf("%+v: want failed_terminal with 3 rows applied", f)
	}
	ctx := context.Background()
	d := ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "reviewed", Partners: []string{"acme"}, Worker: intake.OpsWorker("ops")}
	if err := ops.Release(ctx, pool, d); err != nil {
		t.Fatal(err)
	}
	site.Config.Feeds[0].CSV.Delimiter = ";" // the run after the release reads no header
	r2 := newRigOn(t, pool, intake.Config{WorkerID: "w2", Lease: 30 * time.Second, SpoolMinFree: 1}, r.spoolDir, site)
	r2.reconcileAs("w2", site)
	r2.poll("acme")
	f = files(t, pool, "acme")[0]
	if f.State != "failed_terminal" || f.Reason != string(reason.HeaderMismatch) || f.Applied != 0 {
		t.Fatalf("%+v: want held again for its header, nothing applied by this run", f)
	}
	if rc := receipt(t, site, f.Receipt); rc.Rows.Applied != 0 || rc.Rows.AppliedEarlier != 3 {
		t.Fatalf("receipt rows %+v: want 3 applied before the release, none since", rc.Rows)
	}
	if err := ops.Discard(ctx, pool, d); err != nil {
		t.Fatal(err)
	}
	if err := ops.PublishDecision(ctx, pool, []partners.Config{site.Validated(t)}, f.ID); err != nil {
		t.Fatal(err)
	}
	f = files(t, pool, "acme")[0]
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeDiscarded || rc.Rows.AppliedEarlier != 3 ||
		!strings.Contains(rc.Detail, "3 of its rows, applied by its runs before ops released it, stay") {
		t.Fatalf("receipt %+v: want discarded, saying the 3 rows applied before the release stay", rc)
	}
}

// A file held before its spooled statement (here: larger than its limit,
// found while downloading) has its receipt under its batch's name; when
// ops discard it, the discard's receipt takes that name (the row keeps
// the batch id the receipt was named after), so the partner reads one
// receipt for the file, the latest decision's, not the held one beside
// an intake-<id> one. Its reason file goes from beside the held file,
// though a reload moved quarantine/ since.
func TestADiscardReplacesTheReceiptOfAFileHeldBeforeItSpooled(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Config.Limits.MaxFileBytes = 64
	site.Drop(t, "orders-big.csv", testenv.OrdersCSV("B", 20))
	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	if f.State != "quarantined" || f.Reason != string(reason.FileTooLarge) || !strings.HasPrefix(filepath.Base(f.Receipt), "orders-big.") {
		t.Fatalf("%+v: want quarantined file_too_large, its receipt named after its batch", f)
	}
	held := f.Receipt
	ctx := context.Background()
	if err := ops.Discard(ctx, pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "too large", Partners: []string{"acme"},
		Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	moved := site.Validated(t)
	moved.Dirs.Quarantine = "held"
	if err := ops.PublishDecision(ctx, pool, []partners.Config{moved}, f.ID); err != nil {
		t.Fatal(err)
	}
	for _, n := range site.Files(t, "quarantine") {
		if strings.HasSuffix(n, sitefile.ReasonSuffix) {
			t.Fatalf("quarantine/ still holds the reason file %s of a discarded file", n)
		}
	}
	f = files(t, pool, "acme")[0]
	if f.State != "discarded" || f.Receipt != held {
		t.Fatalf("%+v: want discarded, its receipt in the held one's place %s", f, held)
	}
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeDiscarded {
		t.Fatalf("receipt %+v", rc)
	}
	if got := site.Files(t, "reports"); len(got) != 1 {
		t.Fatalf("reports/ holds %q, want the one receipt", got)
	}
}

// A hold whose end was never recorded: the file failed for good (the
// database refused its statements), the hold moved it to quarantine/ and
// published its reason file and receipt, and then its Finish failed (a
// fault stands in for the database going away), so the row stayed live.
// Its next attempt, the cause fixed, applies it: the file is taken back
// from quarantine/ into the archive and the reason file goes, so the
// partner reads one decision (accepted), not a held file beside an
// accepted receipt. (A file held past its retry budget is not run again:
// TestAFileWhoseHoldFailsPastItsBudgetIsNotRunAgain.)
func TestAHoldNeverRecordedIsUndoneByTheNextDecision(t *testing.T) {
	_, pool := testenv.DB(t)
	poison(t, pool, "H-2", "")
	// a failure no retry mends (P0001), not the transient 40001
	exec(t, pool, `CREATE OR REPLACE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF NEW.order_id = 'H-2' AND EXISTS (SELECT 1 FROM poison_on) THEN
		        RAISE EXCEPTION 'refused';
		    END IF;
		    RETURN NEW;
		END $$`)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-h.csv", testenv.OrdersCSV("H", 3))
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 2, Base: time.Millisecond, Max: time.Millisecond}}, site)
	if err := fault.Set("hold:before_finish=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	r.poll("acme") // failed for good: held, its end not recorded
	f := files(t, pool, "acme")[0]
	if f.State == "failed_terminal" || len(site.Files(t, "quarantine")) != 2 {
		t.Fatalf("%+v, quarantine/ %q: want a live row, the file and its reason file in quarantine/", f, site.Files(t, "quarantine"))
	}
	fault.Set("")
	exec(t, pool, `DELETE FROM poison_on`) // the cause fixed
	// the hold's receipt as one held before the file's batch id was
	// known names it
	earlier := filepath.Join(site.Root, "reports", fmt.Sprintf("intake-%d.receipt.json", f.ID))
	if err := os.WriteFile(earlier, []byte(`{"outcome":"failed"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	waitDue(t, pool, "acme")
	r.poll("acme")
	f = files(t, pool, "acme")[0]
	if f.State != "archived" || f.Applied != 3 || f.Archive == "" {
		t.Fatalf("%+v: want archived with 3 rows", f)
	}
	if got := site.Files(t, "quarantine"); len(got) != 0 {
		t.Fatalf("quarantine/ still holds %q", got)
	}
	rel, _ := filepath.Rel(site.Root, f.Archive)
	if site.Read(t, rel) != testenv.OrdersCSV("H", 3) {
		t.Fatal("the archive does not hold the file")
	}
	if rc := receipt(t, site, f.Receipt); rc.Outcome != ledger.OutcomeAccepted || rc.Detail != "" {
		t.Fatalf("receipt %+v: want accepted, nothing lost", rc)
	}
	if got := site.Files(t, "reports"); len(got) != 1 || got[0] != filepath.Base(f.Receipt) {
		t.Fatalf("reports/ holds %v, want the accepted receipt alone", got)
	}
}

// The same before the file's bytes were spooled (a file over the byte
// limit, a manifest that disagrees with its file, each held as it
// downloads): its retry finds the claimed path empty, takes the file (and
// its manifest) back from quarantine/ and decides again, so it is held
// with its own reason, not taken for lost.
func TestAHoldBeforeTheSpoolNeverRecordedKeepsItsReason(t *testing.T) {
	for _, c := range []struct{ name, state, reason string }{
		{"too large", "quarantined", "file_too_large"},
		{"manifest disagrees", "quarantined", "manifest_mismatch"},
		{"lost beside its manifest", "failed_terminal", "remote_lost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "acme")
			body := testenv.OrdersCSV("B", 100)
			site.Drop(t, "orders-big.csv", body)
			held := 2 // the file (or its manifest) and its reason file
			sum := sha(body)
			switch c.reason {
			case "file_too_large":
				site.Config.Limits.MaxFileBytes = 1000
			case "manifest_mismatch":
				sum, held = sha("something else"), 3
			}
			if c.reason != "file_too_large" {
				site.Config.Readiness = partners.ReadinessManifest
				site.Drop(t, "orders-big.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(body), sum))
			}
			r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
				Retry: intake.RetryPolicy{Attempts: 3, Base: time.Millisecond, Max: time.Millisecond}}, site)
			spec := "hold:before_finish=error"
			if c.reason == "remote_lost" {
				spec += ",download:manifest=pause"
			}
			if err := fault.Set(spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fault.Set("") })
			polled := make(chan struct{})
			go func() {
				defer close(polled)
				r.d.PollOnce(context.Background(), "acme") // the hold's end fails: the poll may say so
			}()
			if c.reason == "remote_lost" { // the claimed file goes before it is read
				<-fault.Paused("download:manifest")
				if err := os.Remove(filepath.Join(site.Root, "processing", "w1", "orders-big.csv")); err != nil {
					t.Fatal(err)
				}
				fault.Resume("download:manifest")
			}
			<-polled
			if f := files(t, pool, "acme")[0]; f.State != "claimed" || len(site.Files(t, "quarantine")) != held {
				t.Fatalf("%+v, quarantine/ %q: want a live row, the file and what went with it in quarantine/", f, site.Files(t, "quarantine"))
			}
			fault.Set("")
			waitDue(t, pool, "acme")
			r.poll("acme")
			f := files(t, pool, "acme")[0]
			if f.State != c.state || f.Reason != c.reason {
				t.Fatalf("%+v: want %s %s", f, c.state, c.reason)
			}
			outcome := ledger.OutcomeQuarantined
			if c.state == "failed_terminal" {
				outcome = ledger.OutcomeFailed
			}
			if rc := receipt(t, site, f.Receipt); rc.Outcome != outcome || string(rc.Reason) != c.reason {
				t.Fatalf("receipt %+v", rc)
			}
			if got := site.Files(t, "quarantine"); len(got) != held {
				t.Fatalf("quarantine/ holds %q, want the file, what went with it and its reason file", got)
			}
		})
	}
}

// poison makes the target fail the row whose order_id is busy with
// SQLSTATE 40001 (a retryable error) while poison_on holds a row (the fix:
// DELETE FROM poison_on), and refuse the row refused by a CHECK (not_p1)
// unless refused is "".
func poison(t *testing.T, pool *pgxpool.Pool, busy, refused string) {
	t.Helper()
	exec(t, pool, `CREATE TABLE poison_on (on_ bool);
		INSERT INTO poison_on VALUES (true);
		CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF NEW.order_id = '`+busy+`' AND EXISTS (SELECT 1 FROM poison_on) THEN
		        RAISE EXCEPTION 'busy' USING ERRCODE = '40001';
		    END IF;
		    RETURN NEW;
		END $$;
		CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION poison()`)
	if refused != "" {
		exec(t, pool, `ALTER TABLE orders ADD CONSTRAINT not_p1 CHECK (order_id <> '`+refused+`')`)
	}
}

// failedPartWay is a file that failed for good part way: a retryable
// error (SQLSTATE 40001) on P-5 past its retry budget of two attempts,
// after two of its three chunks committed, P-1 refused by a CHECK.
func failedPartWay(t *testing.T) (*pgxpool.Pool, *testenv.Site, *rig, fileRow) {
	t.Helper()
	_, pool := testenv.DB(t)
	poison(t, pool, "P-5", "P-1")
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 2 // P-1,P-2 | P-3,P-4 | P-5,P-6
	site.Drop(t, "orders-p.csv", testenv.OrdersCSV("P", 6))
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 2, Base: time.Millisecond, Max: time.Millisecond}}, site)
	r.poll("acme")
	waitDue(t, pool, "acme")
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	return pool, site, r, f
}

// waitDue waits until every file of the partner that waits for a retry
// is due by the database's clock (the poll compares its next attempt
// with the database's now()).
func waitDue(t *testing.T, pool *pgxpool.Pool, partner string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND next_attempt_at > pg_catalog.clock_timestamp()`, partner) == 0
	}, testenv.Says("files of "+partner+" due for their retry"))
}

// An entry of ready/ the site refuses to move (a permission, an immutable
// file, a folder a gateway cannot rename) holds up nothing: the poll goes
// on past it to the partner's other files, and neither a data file nor a
// hostile entry (moved to quarantine/ before any claim) ends the poll.
// Before, the refused RENAME ended every poll, whose next one tried the
// same oldest entry first: no file of the partner was claimed again. Once
// the site lets the entries go, they are claimed as any other.
func TestAnEntryTheSiteWillNotMoveHoldsUpNothing(t *testing.T) {
	defer intake.SetRefusedFor(0)() // tried again at every poll
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "stuck")
	site.Config.GroupFiles = 1 // each file claimed alone: its claim's error was the poll's
	r := newRig(t, pool, "w1", site)
	const stuck, hostile, good = "orders-20261101.csv", "invoice.pdf", "orders-20261102.csv"
	site.Drop(t, stuck, goodRows("S", 2))
	site.Drop(t, hostile, "not a feed's file")
	site.Drop(t, good, goodRows("G", 2))
	old := time.Now().Add(-time.Hour)
	for _, n := range []string{stuck, hostile} { // the oldest: claimed first
		if err := os.Chtimes(filepath.Join(site.Root, "ready", n), old, old); err != nil {
			t.Fatal(err)
		}
	}
	srv.RefuseRenames(func(from string) bool {
		return strings.HasSuffix(from, "/ready/"+stuck) || strings.HasSuffix(from, "/ready/"+hostile)
	})

	r.poll("stuck")
	state := func() map[string]string {
		got := map[string]string{}
		for _, f := range files(t, pool, "stuck") {
			got[f.Name] = f.State
		}
		return got
	}
	if got := state(); len(got) != 1 || got[good] != "archived" {
		t.Fatalf("files %v, want %s archived past the entries the site will not move", got, good)
	}
	if got := site.Files(t, "ready"); !slices.Equal(got, []string{hostile, stuck}) {
		t.Fatalf("ready/ holds %v, want the two refused entries", got)
	}
	if n := testutil.ToFloat64(r.d.Metrics().Skipped.WithLabelValues("stuck", "claim_refused")); n != 2 {
		t.Fatalf("intake_ready_entries_skipped_total{reason=\"claim_refused\"} %v, want 2", n)
	}

	srv.RefuseRenames(nil)
	r.poll("stuck")
	if got := state(); got[stuck] != "archived" || got[good] != "archived" || len(got) != 3 {
		t.Fatalf("files %v, want %s archived and the hostile entry held once the site lets them go", got, stuck)
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ still holds %v", got)
	}
}

// Entries of ready/ the site refuses to move do not take the poll's places
// among the oldest files (max_files_per_poll) at every poll: each is passed
// over a while once refused, so a newer file is claimed at the next poll.
// Before, the same refused entries filled the places at every poll and the
// newer file was never claimed.
func TestEntriesTheSiteWillNotMoveDoNotTakeThePollsPlaces(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "places")
	site.Config.Limits.MaxFilesPerPoll = 2
	r := newRig(t, pool, "w1", site)
	stuck := []string{"orders-20261101.csv", "orders-20261102.csv"}
	const good = "orders-20261103.csv"
	old := time.Now().Add(-time.Hour)
	for _, n := range stuck {
		site.Drop(t, n, goodRows("S", 2))
		if err := os.Chtimes(filepath.Join(site.Root, "ready", n), old, old); err != nil {
			t.Fatal(err)
		}
	}
	site.Drop(t, good, goodRows("G", 2))
	srv.RefuseRenames(func(from string) bool {
		return !strings.HasSuffix(from, "/ready/"+good) && strings.Contains(from, "/ready/")
	})
	r.poll("places")
	if fs := files(t, pool, "places"); len(fs) != 0 {
		t.Fatalf("files %+v, want none: the two oldest places were the refused entries", fs)
	}
	r.poll("places")
	if fs := files(t, pool, "places"); len(fs) != 1 || fs[0].Name != good || fs[0].State != "archived" {
		t.Fatalf("files %+v, want %s archived past the refused entries", fs, good)
	}
	if got := site.Files(t, "ready"); !slices.Equal(got, stuck) {
		t.Fatalf("ready/ holds %v, want the refused entries", got)
	}
	// passed over, they still count as waiting in ready/ as the listing
	// saw it (the newer file and the two; their age raises
	// IntakeReadyBacklog)
	const want = `
# HELP intake_ready_files Claimable files in ready/ at the last poll.
# TYPE intake_ready_files gauge
intake_ready_files{partner="places"} 3
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want), "intake_ready_files"); err != nil {
		t.Fatalf("want the 2 entries passed over counted in ready/ beside the file claimed: %v", err)
	}
}

// In manifest mode, data files whose manifest never comes do not take the
// poll's places among the oldest (max_files_per_poll) for good: once a
// listing found them without their manifest, the next ones set them aside
// until it comes, so the complete pair behind them is claimed by the next
// poll, and each of them once its manifest comes. Before, the two oldest
// data files held both places at every poll, and the pair behind them was
// never claimed.
func TestDataFilesWhoseManifestNeverComesDoNotTakeThePollsPlaces(t *testing.T) {
	_, pool := testenv.DB(t)
	_, site := testenv.NewInProcessSite(t, "unpaired")
	site.Config.Readiness = partners.ReadinessManifest
	site.Config.Limits.MaxFilesPerPoll = 2
	r := newRig(t, pool, "w1", site)
	manifest := func(name, data string) {
		site.Drop(t, name+partners.ManifestSuffix, fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(data), sha(data)))
	}
	lone := []string{"orders-20261101.csv", "orders-20261102.csv"}
	const good = "orders-20261103.csv"
	old := time.Now().Add(-time.Hour)
	for _, n := range lone {
		site.Drop(t, n, goodRows(n[13:15], 2))
		if err := os.Chtimes(filepath.Join(site.Root, "ready", n), old, old); err != nil {
			t.Fatal(err)
		}
	}
	site.Drop(t, good, goodRows("G", 2))
	manifest(good, goodRows("G", 2))
	names := func() (got []string) {
		for _, f := range files(t, pool, "unpaired") {
			if f.State == "archived" {
				got = append(got, f.Name)
			}
		}
		return got
	}
	r.poll("unpaired") // the first listing cannot know them unpaired before its end
	r.poll("unpaired")
	if got := names(); !slices.Equal(got, []string{good}) {
		t.Fatalf("archived %v, want the pair behind the data files without manifests", got)
	}
	r.poll("unpaired")
	if got := site.Files(t, "ready"); !slices.Equal(got, lone) {
		t.Fatalf("ready/ holds %v, want the data files still waiting for their manifests", got)
	}
	manifest(lone[1], goodRows(lone[1][13:15], 2))
	r.poll("unpaired")
	if got := names(); !slices.Equal(got, []string{good, lone[1]}) {
		t.Fatalf("archived %v, want the data file set aside claimed once its manifest came", got)
	}
}

// A manifest the site refuses to move beside its claimed file holds up
// nothing: the file goes back into ready/ beside it, refused as its own
// move would be, and the partner's other pairs apply in the same poll and
// the next; once the site lets the manifest go, the pair applies. Before,
// the claim's error ended every poll of the partner: the claim failed,
// and each later poll's adoption of the file met the same refusal.
func TestAManifestTheSiteWillNotMoveHoldsUpNothing(t *testing.T) {
	defer intake.SetRefusedFor(0)() // tried again at every poll
	_, pool := testenv.DB(t)
	srv, site := testenv.NewInProcessSite(t, "stuckm")
	site.Config.Readiness = partners.ReadinessManifest
	site.Config.GroupFiles = 1
	r := newRig(t, pool, "w1", site)
	pair := func(name, data string) {
		site.Drop(t, name, data)
		site.Drop(t, name+partners.ManifestSuffix, fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(data), sha(data)))
	}
	const stuck, good, later = "orders-20261101.csv", "orders-20261102.csv", "orders-20261103.csv"
	pair(stuck, goodRows("S", 2))
	pair(good, goodRows("G", 2))
	old := time.Now().Add(-time.Hour)
	for _, n := range []string{stuck, stuck + partners.ManifestSuffix} { // the oldest: claimed first
		if err := os.Chtimes(filepath.Join(site.Root, "ready", n), old, old); err != nil {
			t.Fatal(err)
		}
	}
	srv.RefuseRenames(func(from string) bool { return strings.HasSuffix(from, "/ready/"+stuck+partners.ManifestSuffix) })
	r.poll("stuckm")
	pair(later, goodRows("L", 2))
	r.poll("stuckm")
	state := func() map[string]string {
		got := map[string]string{}
		for _, f := range files(t, pool, "stuckm") {
			got[f.Name] = f.State
		}
		return got
	}
	if got := state(); len(got) != 2 || got[good] != "archived" || got[later] != "archived" {
		t.Fatalf("files %v, want the two other pairs archived and none of the pair whose manifest stays", got)
	}
	if got := site.Files(t, "ready"); !slices.Equal(got, []string{stuck, stuck + partners.ManifestSuffix}) {
		t.Fatalf("ready/ holds %v, want the pair whose manifest the site will not move", got)
	}
	srv.RefuseRenames(nil)
	r.poll("stuckm")
	if got := state(); len(got) != 3 || got[stuck] != "archived" {
		t.Fatalf("files %v, want the pair archived once the site lets its manifest go", got)
	}
}

// A file past its retry budget whose hold fails (the site refuses to move
// it to quarantine/) is not run again: its next attempts hold it without
// applying it, until the hold goes through. Before, every backoff ran the
// whole file again, for good, and here applied it once its rows no longer
// failed.
func TestAFileWhoseHoldFailsPastItsBudgetIsNotRunAgain(t *testing.T) {
	_, pool := testenv.DB(t)
	poison(t, pool, "P-2", "") // P-2 fails every try, transient (40001)
	srv, site := testenv.NewInProcessSite(t, "spent")
	site.Config.GroupFiles = 1
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 2, Base: time.Millisecond, Max: time.Millisecond}}, site)
	site.Drop(t, "orders-1.csv", goodRows("P", 2))
	srv.RefuseRenames(func(from string) bool { return strings.Contains(from, "/processing/") })
	for range 3 {
		r.poll("spent")
		waitDue(t, pool, "spent")
	}
	f := files(t, pool, "spent")[0]
	if f.State == "failed_terminal" || f.Reason != string(reason.RetriesExhausted) || f.Applied != 0 {
		t.Fatalf("%+v, want the file live with its budget spent, its hold refused by the site", f)
	}
	exec(t, pool, `DELETE FROM poison_on`) // its rows would apply now
	r.poll("spent")
	waitDue(t, pool, "spent")
	r.poll("spent")
	if f = files(t, pool, "spent")[0]; f.State == "archived" || f.Applied != 0 {
		t.Fatalf("%+v: a file past its budget was run again", f)
	}
	srv.RefuseRenames(nil) // the site lets the hold through
	waitDue(t, pool, "spent")
	r.poll("spent")
	if f = files(t, pool, "spent")[0]; f.State != "failed_terminal" || f.Reason != string(reason.RetriesExhausted) {
		t.Fatalf("%+v, want it held failed_terminal retries_exhausted once the site lets it", f)
	}
}

// A decision names the hold it decides on (ledger.HoldToken, what `intake
// quarantine show` and the console print). A file released and held again
// since, for another reason, is a new hold: a decision made on the first
// one is refused, naming the new one, and nothing changes; a decision on
// the hold that stands goes through.
func TestADecisionOnAHoldTheFileLeftIsRefused(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Config.Limits.MaxFileBytes = 64
	var b strings.Builder
	b.WriteString(testenv.OrdersHeader)
	for i := range 10 {
		fmt.Fprintf(&b, "RH-%d,not-an-email,1.00,paid,2026-11-01T00:00:00Z,1\n", i)
	}
	site.Drop(t, "orders-rh.csv", b.String())
	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	f := files(t, pool, "acme")[0]
	if f.State != "quarantined" || f.Reason != string(reason.FileTooLarge) {
		t.Fatalf("%+v: want it held as too large", f)
	}
	ctx := context.Background()
	seen := func() string {
		t.Helper()
		qs, err := ops.ListQuarantine(ctx, pool, []string{"acme"}, true)
		if err != nil || len(qs) != 1 {
			t.Fatalf("open holds %+v, %v", qs, err)
		}
		return qs[0].Hold
	}
	first := seen()
	decide := func(hold string) ops.Decision {
		return ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "checked", Partners: []string{"acme"},
			Worker: intake.OpsWorker("ops"), Hold: hold}
	}
	if err := ops.Release(ctx, pool, decide(first)); err != nil {
		t.Fatal(err)
	}
	r.reconcileOnce(site)
	r.poll("acme")
	f = files(t, pool, "acme")[0]
	if f.State != "quarantined" || f.Reason != string(reason.RejectRate) {
		t.Fatalf("%+v: want it released and held again for its rejected rows", f)
	}
	again := seen()
	if again == first {
		t.Fatalf("the second hold has the first one's token %s", first)
	}
	audits := testenv.Count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1`, f.ID)
	for _, d := range []func(context.Context, *pgxpool.Pool, ops.Decision) error{ops.Release, ops.Discard} {
		err := d(ctx, pool, decide(first))
		if !errors.Is(err, ledger.ErrDecision) || !strings.Contains(err.Error(), "held again since hold "+first+": it is now hold "+again+" (reject_rate_exceeded)") {
			t.Fatalf("a decision on the hold the file left: %v", err)
		}
	}
	if g := files(t, pool, "acme")[0]; g.State != "quarantined" || testenv.Count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1`, f.ID) != audits {
		t.Fatalf("%+v: a refused decision changed the file or its audit", g)
	}
	if err := ops.Discard(ctx, pool, decide(again)); err != nil {
		t.Fatal(err)
	}
	if g := files(t, pool, "acme")[0]; g.State != "discarded" {
		t.Fatalf("%+v: want it discarded", g)
	}
}

// A chunk's COMMIT whose outcome is lost ends the run there, cleanly: the
// file is outcome_unknown (recorded), no later chunk is tried and nothing
// marks it applied, so the run reports no error of its own; the next
// reconcile run reads the chunk ledger and the file resumes after the
// chunks that are in. Each chunk is applied once.
func TestARunStopsAtACommitWhoseOutcomeIsLost(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Config.Feeds[0].ChunkRows = 3
	site.Drop(t, "orders-lost.csv", testenv.OrdersCSV("L", 10))
	r := newRig(t, pool, "w1", site)
	r.poll("acme")
	orig := files(t, pool, "acme")[0]
	if orig.State != "archived" {
		t.Fatalf("%+v", orig)
	}
	if err := fault.Set("commit:lost=error@2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: orig.ID, Actor: "test", Reason: "re-apply"})
	fault.Set("")
	if err != nil || in.State != ledger.StateOutcomeUnknown {
		t.Fatalf("replay: %+v, %v: want it to end outcome_unknown with no error of its own", in, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1`, in.ID); n != 1 {
		t.Fatalf("%d chunks of the replay in the ledger, want the first (the second's COMMIT never reached the server)", n)
	}
	r.reconcileOnce(site)
	r.poll("acme")
	got := files(t, pool, "acme")
	if f := got[len(got)-1]; f.ID != in.ID || f.State != "archived" || f.Chunks != 4 || f.Unchanged != 10 {
		t.Fatalf("%+v: want the replay archived, its 10 rows unchanged over 4 chunks", f)
	}
}

// A file whose feed a reload removed while it was in flight fails for
// good (feed_unconfigured) and is held under the name every held file of
// a feed has: once the feed is back and ops release it, it is archived
// and its reason file goes with the hold. Held under a hostile entry's
// generated name, the reason file stayed in quarantine/, telling the
// partner the file was held beside its archive receipt.
func TestAFileWhoseFeedWasRemovedIsHeldAsAFileOfAFeed(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "acme")
	fix := testenv.OrdersFeed()
	fix.Name, fix.Pattern = "fix", `fix-.*\.csv`
	site.Config.Feeds = append(site.Config.Feeds, fix)
	const name = "orders-1.csv"
	site.Drop(t, name, goodRows("G", 3))
	if err := fault.Set("download:mid=error"); err != nil {
		t.Fatal(err)
	}
	w1 := newRig(t, pool, "w1", site)
	w1.d.PollOnce(ctx, "acme") // fails at the fault: the file in flight
	fault.Set("")
	w1.d.Stop()

	orders := site.Config.Feeds[0]
	site.Config.Feeds = site.Config.Feeds[1:] // the orders feed removed
	execArgs(t, pool, `UPDATE file_intake SET lease_until = pg_catalog.now() - interval '1 second' WHERE partner_id = 'acme'`)
	reconcileAs(t, pool, "w2", site)
	w2 := newRig(t, pool, "w2", site)
	w2.d.TakenOver("acme")
	w2.poll("acme")
	f := files(t, pool, "acme")[0]
	if f.State != "failed_terminal" || f.Reason != string(reason.FeedGone) {
		t.Fatalf("%+v, want failed_terminal %s", f, reason.FeedGone)
	}
	held := sitefile.HeldName(f.ID, name)
	if got := site.Files(t, "quarantine"); !slices.Contains(got, held) || !slices.Contains(got, sitefile.ReasonName(held)) {
		t.Fatalf("quarantine/ holds %v, want %s beside its reason file", got, held)
	}
	w2.d.Stop()

	site.Config.Feeds = append(site.Config.Feeds, orders) // the feed back
	w3 := newRig(t, pool, "w3", site)
	if err := ops.Release(ctx, pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "feed restored",
		Partners: []string{"acme"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	reconcileAs(t, pool, "w3", site)
	w3.d.TakenOver("acme")
	w3.poll("acme")
	if f = files(t, pool, "acme")[0]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("%+v, want the released file archived with its 3 rows", f)
	}
	if got := site.Files(t, "quarantine"); len(got) != 0 {
		t.Fatalf("quarantine/ still holds %v after the file was archived", got)
	}
	// held before its batch id was known, its receipt then had another
	// name: the partner reads one receipt, the archive's
	if got := site.Files(t, "reports"); len(got) != 1 || got[0] != path.Base(f.Receipt) {
		t.Fatalf("reports/ holds %v, want the archive's receipt %s alone", got, path.Base(f.Receipt))
	}
}

// A lock not had within a lock_timeout the database sets (its rows held by
// the application) is transient: the file waits for its next attempt and
// applies once the lock is gone, not failed for good.
func TestALockTimeoutTheDatabaseSetsIsRetried(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	exec(t, pool, `DO $$ BEGIN EXECUTE pg_catalog.format('ALTER DATABASE %I SET lock_timeout = %L', pg_catalog.current_database(), '200ms'); END $$`)
	pool.Reset() // new sessions take it
	site := testenv.NewSite(t, "acme")
	r := newRigCfg(t, pool, intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 5, Base: time.Millisecond, Max: time.Millisecond}}, site)
	site.Drop(t, "orders-1.csv", goodRows("L", 3))
	r.poll("acme")
	app := appHoldsRows(t, pool, "acme")
	site.Drop(t, "orders-2.csv", strings.ReplaceAll(goodRows("L", 3), ",paid,", ",shipped,"))
	r.poll("acme")
	f := files(t, pool, "acme")[1]
	if f.State == "failed_terminal" || f.State == "archived" {
		t.Fatalf("%+v, want the file waiting for its next attempt while its rows are locked", f)
	}
	if err := app.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitDue(t, pool, "acme")
	r.poll("acme")
	if f = files(t, pool, "acme")[1]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("%+v, want archived with its 3 rows once the lock is gone", f)
	}
}

// A decision on a held file replaces what its hold published wherever
// that is: the partner's reports dir changed between the hold and the
// decision. Released, the partner reads the release's receipt and rejects
// report alone; discarded, the discard's receipt (and the hold's rejects
// report). The paths the hold recorded stay on the row until then
// (ledger.Reopen, ledger.CloseHeld). Before, the hold's reports were left
// in the old dir beside the new ones: the decision derived their names in
// the new one.
func TestADecisionReplacesTheHoldsReportsInAReportsDirMovedSince(t *testing.T) {
	for _, decision := range []string{"release", "discard"} {
		t.Run(decision, func(t *testing.T) {
			_, pool := testenv.DB(t)
			ctx := context.Background()
			_, site := testenv.NewInProcessSite(t, "moved")
			site.Config.Feeds[0].MaxRejectRatio = 0.1
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-7.csv", strings.Replace(goodRows("R", 4), ",paid,", ",bogus,", 1))
			r.poll("moved")
			f := files(t, pool, "moved")[0]
			if f.State != "quarantined" || f.Receipt == "" || f.Rejects == "" {
				t.Fatalf("%+v, want held over its reject ratio with a receipt and a rejects report", f)
			}
			if got := site.Files(t, "reports"); len(got) != 2 {
				t.Fatalf("reports/ holds %v, want the hold's receipt and rejects report", got)
			}
			r.d.Stop()

			site.Config.Dirs.Reports = "receipts"
			d := ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "reviewed", Partners: []string{"moved"}, Worker: intake.OpsWorker("ops")}
			if decision == "discard" {
				// the command could not reach the site: the reconciler
				// publishes the decision. The hold's rejects report stays
				// where it is: what it lists was refused, and nothing of
				// the file was applied.
				if err := ops.Discard(ctx, pool, d); err != nil {
					t.Fatal(err)
				}
				r.reconcileOnce(site)
				f = files(t, pool, "moved")[0]
				if got := site.Files(t, "receipts"); f.State != "discarded" || !slices.Equal(got, []string{path.Base(f.Receipt)}) ||
					!strings.Contains(site.Read(t, "receipts/"+got[0]), `"outcome": "discarded"`) {
					t.Fatalf("%+v, receipts/ %v: want discarded, its receipt in receipts/ saying so", f, got)
				}
				if got := site.Files(t, "reports"); len(got) != 1 || got[0] != path.Base(f.Rejects) {
					t.Fatalf("reports/ holds %v, want the hold's rejects report alone (its receipt said held beside the discard's)", got)
				}
				return
			}
			r2 := newRig(t, pool, "w1", site)
			if err := ops.Release(ctx, pool, d); err != nil {
				t.Fatal(err)
			}
			r2.reconcileOnce(site)
			r2.poll("moved")
			f = files(t, pool, "moved")[0]
			if f.State != "archived" || f.Rejected != 1 {
				t.Fatalf("%+v, want archived with its rejected row", f)
			}
			if got := site.Files(t, "reports"); len(got) != 0 {
				t.Fatalf("reports/ still holds %v, the hold's reports beside the release's", got)
			}
			if got := site.Files(t, "receipts"); !slices.Equal(got, []string{path.Base(f.Receipt), path.Base(f.Rejects)}) {
				t.Fatalf("receipts/ holds %v, want the release's receipt %s and rejects report %s", got, path.Base(f.Receipt), path.Base(f.Rejects))
			}
		})
	}
}

// appHoldsRows is the application holding every row of partner in
// orders (SELECT … FOR UPDATE) in a transaction the test ends; rolled
// back at the test's end if it did not.
func appHoldsRows(t *testing.T, pool *pgxpool.Pool, partner string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	app, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Rollback(ctx) })
	if _, err := app.Exec(ctx, `SELECT 1 FROM orders WHERE partner_id = $1 FOR UPDATE`, partner); err != nil {
		t.Fatal(err)
	}
	return app
}
