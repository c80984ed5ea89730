package intake_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// issues returns the row issues of an intake as "line:reason:outcome".
func issues(t *testing.T, pool *pgxpool.Pool, id int64) []string {
	t.Helper()
	return testenv.Strings(t, pool, `SELECT line || ':' || reason || ':' || outcome FROM intake_row_issue WHERE intake_id = $1 ORDER BY line`, id)
}

func amountOf(t *testing.T, pool *pgxpool.Pool, table, partner, key string) (string, int64) {
	t.Helper()
	var amount string
	var last int64
	if err := pool.QueryRow(context.Background(), `SELECT amount::text, last_intake_id FROM `+table+` WHERE partner_id = $1 AND order_id = $2`, partner, key).Scan(&amount, &last); err != nil {
		t.Fatalf("%s %s: %v", partner, key, err)
	}
	return amount, last
}

func execArgs(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// A second file meets the rows a first file wrote, under the feed's
// on_outside_edit and mode:
//   - keep (the default): a row another session changed between the two
//     files is not overwritten; the second file reports it as a conflict
//     with reason outside_edit (row issue, rejects report, metric); so
//     does a replay of the first file. A row without a recorded hash
//     (written before the column existed) counts as not edited, is
//     written, and gets its hash; a row edited back to what intake wrote
//     is no edit.
//   - overwrite: writes over an outside edit, as before the guard, and
//     clears the hash.
//   - insert_only: an existing key is a conflict (exists), a new one is
//     written; a replay of the file that wrote the rows changes nothing.
func TestASecondFileMeetsTheFirstFilesRows(t *testing.T) {
	type written struct {
		amount string
		by     int // the file that wrote it: 0 the first, 1 the second
	}
	for _, tc := range []struct {
		name, partner string
		feed          func(f *partners.Feed)
		first         string
		// between runs after the first file, before the second
		between func(t *testing.T, pool *pgxpool.Pool)
		second  string
		// the second file's rows: applied, unchanged, conflicts, total
		applied, unchanged, confl, total int64
		issues                           []string
		rows                             map[string]written
		then                             func(t *testing.T, r *rig, site *testenv.Site, f1, f2 fileRow)
	}{
		{name: "keep", partner: "oe",
			feed:  func(*partners.Feed) {},
			first: goodRows("E", 3),
			between: func(t *testing.T, pool *pgxpool.Pool) {
				if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'oe' AND intake_row_hash IS NOT NULL`); n != 3 {
					t.Fatalf("%d rows carry intake's hash after the first file, want 3", n)
				}
				exec(t, pool, `UPDATE orders SET amount = 1.00 WHERE partner_id = 'oe' AND order_id = 'E-1'`)
				// E-2 as a row written before the guard: no hash, and other values
				exec(t, pool, `UPDATE orders SET amount = 2.00, intake_row_hash = NULL WHERE partner_id = 'oe' AND order_id = 'E-2'`)
			},
			second:  goodRows("E", 3),
			applied: 1, unchanged: 1, confl: 1, total: 3, // the unhashed row applied, the edited one a conflict
			issues: []string{"2:outside_edit:conflict"},
			rows:   map[string]written{"E-1": {"1.00", 0}, "E-2": {"20.02", 1}},
			then: func(t *testing.T, r *rig, site *testenv.Site, f1, f2 fileRow) {
				pool := r.pool
				if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'oe' AND order_id = 'E-2' AND intake_row_hash IS NOT NULL`); n != 1 {
					t.Fatal("the unhashed row got no hash when intake wrote it")
				}
				rel, _ := filepath.Rel(site.Root, f2.Rejects)
				if f2.Rejects == "" || !strings.Contains(site.Read(t, rel), "outside_edit") {
					t.Fatalf("rejects report %q does not name outside_edit", f2.Rejects)
				}
				if got := testutil.ToFloat64(r.d.Metrics().RowsHeld.WithLabelValues("oe", "outside_edit")); got != 1 {
					t.Fatalf("intake_rows_held_total{outside_edit} = %v, want 1", got)
				}
				// a replay of the first file writes as that file: E-1 still kept
				in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: f1.ID, Actor: "test", Reason: "re-apply"})
				if err != nil {
					t.Fatal(err)
				}
				if got := issues(t, pool, in.ID); len(got) != 1 || got[0] != "2:outside_edit:conflict" {
					t.Fatalf("replay row issues %v, want line 2 outside_edit conflict", got)
				}
				if a, _ := amountOf(t, pool, "orders", "oe", "E-1"); a != "1.00" {
					t.Fatalf("E-1 = %s after the replay: the outside edit was overwritten", a)
				}
				// an edit back to what intake wrote is no edit: the next file writes
				exec(t, pool, `UPDATE orders SET amount = 10.01 WHERE partner_id = 'oe' AND order_id = 'E-1'`)
				site.Drop(t, "orders-3.csv", header+ordersLine("E", 1, "5.00"))
				r.poll("oe")
				f3 := files(t, pool, "oe")[3]
				if f3.Applied != 1 || f3.Confl != 0 {
					t.Fatalf("third file %+v, want 1 applied", f3)
				}
			}},
		{name: "overwrite", partner: "ow",
			feed:  func(f *partners.Feed) { f.OnOutsideEdit = partners.OutsideEditOverwrite },
			first: goodRows("O", 2),
			between: func(t *testing.T, pool *pgxpool.Pool) {
				exec(t, pool, `UPDATE orders SET amount = 1.00 WHERE partner_id = 'ow' AND order_id = 'O-1'`)
			},
			second:  goodRows("O", 2),
			applied: 1, unchanged: 1, confl: 0, total: 2, // the edit overwritten
			rows: map[string]written{"O-1": {"10.01", 1}},
			then: func(t *testing.T, r *rig, _ *testenv.Site, _, _ fileRow) {
				// an overwrite feed keeps no hash up (it pays nothing for
				// the guard): a write leaves it "not known"
				if n := count(t, r.pool, `SELECT count(*) FROM orders WHERE partner_id = 'ow' AND order_id = 'O-1' AND intake_row_hash IS NULL`); n != 1 {
					t.Fatal("an overwrite write left a hash behind")
				}
			}},
		{name: "insert_only", partner: "io",
			feed:    func(f *partners.Feed) { f.Mode = partners.ModeInsertOnly },
			first:   goodRows("I", 2),
			between: func(*testing.T, *pgxpool.Pool) {},
			second:  header + ordersLine("I", 1, "5.00") + ordersLine("I", 2, "20.02") + ordersLine("I", 3, "30.03"),
			applied: 1, unchanged: 0, confl: 2, total: 3,
			issues: []string{"2:exists:conflict", "3:exists:conflict"},
			rows:   map[string]written{"I-1": {"10.01", 0}}, // insert_only updated no row
			then: func(t *testing.T, r *rig, _ *testenv.Site, f1, _ fileRow) {
				in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: f1.ID, Actor: "test", Reason: "re-apply"})
				if err != nil {
					t.Fatal(err)
				}
				if got := issues(t, r.pool, in.ID); len(got) != 0 {
					t.Fatalf("replay of the writing file: row issues %v, want none", got)
				}
				if got := testutil.ToFloat64(r.d.Metrics().RowsHeld.WithLabelValues("io", "exists")); got != 2 {
					t.Fatalf("intake_rows_held_total{exists} = %v, want 2", got)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, tc.partner)
			tc.feed(&site.Config.Feeds[0])
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-1.csv", tc.first)
			r.poll(tc.partner)
			tc.between(t, pool)
			site.Drop(t, "orders-2.csv", tc.second)
			r.poll(tc.partner)
			fs := files(t, pool, tc.partner)
			f1, f2 := fs[0], fs[1]
			if f2.State != "archived" || f2.Applied != tc.applied || f2.Unchanged != tc.unchanged || f2.Confl != tc.confl || f2.Total != tc.total {
				t.Fatalf("second file %+v, want archived with %d applied, %d unchanged, %d conflicts of %d rows", f2, tc.applied, tc.unchanged, tc.confl, tc.total)
			}
			if got := issues(t, pool, f2.ID); strings.Join(got, ",") != strings.Join(tc.issues, ",") {
				t.Fatalf("row issues %v, want %v", got, tc.issues)
			}
			for key, w := range tc.rows {
				by := []fileRow{f1, f2}[w.by]
				if a, last := amountOf(t, pool, "orders", tc.partner, key); a != w.amount || last != by.ID {
					t.Fatalf("%s = %s by %d, want %s by %d", key, a, last, w.amount, by.ID)
				}
			}
			tc.then(t, r, site, f1, f2)
		})
	}
}

// A fresh load into a guarded table goes COPY straight into it, each row
// with the hash intake computed as it encoded the row (no staging table is
// made). Rows written before intake computed the hash itself carry the
// server's hash_record_extended hash: the guard takes it as intake's (no
// outside_edit), the write records the new one, and a row edited since is
// still told.
func TestOutsideEditGuardAcceptsLegacyHashes(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "lh")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("L", 3))
	r.poll("lh")
	if n := count(t, pool, `SELECT count(*) FROM pg_class WHERE relname LIKE 'intake_stage_%'`); n != 0 {
		t.Fatalf("%d staging tables: the fresh load into the guarded table did not go COPY straight in", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'lh' AND intake_row_hash IS NOT NULL`); n != 3 {
		t.Fatalf("%d rows carry intake's hash after a fresh load, want 3", n)
	}
	// the hash as intake recorded it before: hash_record_extended over
	// the feed's non-key columns; L-3 then edited outside intake
	legacy := `hash_record_extended(ROW(email, amount, status, placed_at, qty), 0)`
	exec(t, pool, `UPDATE orders SET intake_row_hash = `+legacy+` WHERE partner_id = 'lh'`)
	exec(t, pool, `UPDATE orders SET amount = 3.33 WHERE partner_id = 'lh' AND order_id = 'L-3'`)

	site.Drop(t, "orders-2.csv", header+ordersLine("L", 1, "5.00")+ordersLine("L", 2, "6.00")+ordersLine("L", 3, "7.00"))
	r.poll("lh")
	f2 := files(t, pool, "lh")[1]
	if f2.State != "archived" || f2.Applied != 2 || f2.Confl != 1 {
		t.Fatalf("second file %+v, want archived with 2 applied (legacy hashes taken as intake's), 1 conflict", f2)
	}
	if got := issues(t, pool, f2.ID); len(got) != 1 || got[0] != "4:outside_edit:conflict" {
		t.Fatalf("row issues %v, want only L-3 (line 4) outside_edit", got)
	}
	if a, _ := amountOf(t, pool, "orders", "lh", "L-3"); a != "3.33" {
		t.Fatalf("L-3 = %s: the outside edit was overwritten", a)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'lh' AND order_id IN ('L-1', 'L-2')
		AND intake_row_hash IS NOT NULL AND intake_row_hash <> `+legacy); n != 2 {
		t.Fatalf("%d of the rewritten rows carry the new hash, want 2", n)
	}
	// the new hash is intake's own too: the next file writes them
	site.Drop(t, "orders-3.csv", header+ordersLine("L", 1, "8.00")+ordersLine("L", 2, "9.00"))
	r.poll("lh")
	if f3 := files(t, pool, "lh")[2]; f3.Applied != 2 || f3.Confl != 0 {
		t.Fatalf("third file %+v, want 2 applied", f3)
	}
}

// The guard on the COPY text path (a column type without a binary
// encoder) and in groups of small files.
func TestOutsideEditOnCopyTextAndInGroups(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `CREATE TABLE orders_text (
		partner_id text NOT NULL, order_id text NOT NULL, email text, amount double precision NOT NULL,
		status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL,
		intake_row_hash bigint, PRIMARY KEY (partner_id, order_id))`)
	// money has no extended hash function: the hash falls back to md5
	exec(t, pool, `CREATE TABLE orders_money (
		partner_id text NOT NULL, order_id text NOT NULL, email text, amount money NOT NULL,
		status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL,
		intake_row_hash bigint, PRIMARY KEY (partner_id, order_id))`)
	for _, tc := range []struct{ partner, table string }{{"gt", "orders_text"}, {"gb", "orders"}, {"gm", "orders_money"}} {
		site := testenv.NewSite(t, tc.partner)
		site.Config.Feeds[0].Target = tc.table
		r := newRig(t, pool, "w-"+tc.partner, site) // one live process per worker id: the rigs live on side by side
		// first a group of two files, then a group of two that meets an edit
		site.Drop(t, "orders-1.csv", goodRows("A", 2))
		site.Drop(t, "orders-2.csv", goodRows("B", 2))
		r.poll(tc.partner)
		execArgs(t, pool, `UPDATE `+tc.table+` SET amount = 3 WHERE partner_id = $1 AND order_id = 'B-2'`, tc.partner)
		site.Drop(t, "orders-3.csv", goodRows("A", 2))
		site.Drop(t, "orders-4.csv", goodRows("B", 2))
		r.poll(tc.partner)
		if got := grouped(r, tc.partner, "grouped"); got != 4 {
			t.Fatalf("%s: %v files went through a group, want 4", tc.table, got)
		}
		m := byName(files(t, pool, tc.partner))
		if f3, f4 := m["orders-3.csv"], m["orders-4.csv"]; f3.Unchanged != 2 || f4.Unchanged != 1 || f4.Confl != 1 || f4.State != "archived" {
			t.Fatalf("%s: %+v, %+v: want 2 unchanged; 1 unchanged and 1 conflict", tc.table, f3, f4)
		}
		if n := count(t, pool, `SELECT count(*) FROM `+tc.table+` WHERE partner_id = $1 AND order_id = 'B-2' AND amount::numeric = 3`, tc.partner); n != 1 {
			t.Fatalf("%s: B-2: the outside edit was overwritten", tc.table)
		}
		if got := issues(t, pool, m["orders-4.csv"].ID); len(got) != 1 || got[0] != "3:outside_edit:conflict" {
			t.Fatalf("%s: row issues %v", tc.table, got)
		}
		r.d.Stop() // before the next case's: one process of w1 at a time
	}
}

// update_only: a key the target lacks is rejected (not_found) and not
// written; existing keys are updated. Files of such a feed are not
// grouped (their rejects need the file's own report).
func TestUpdateOnlyMode(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "uo")
	site.Config.Feeds[0].Mode = partners.ModeUpdateOnly
	r := newRig(t, pool, "w1", site)
	exec(t, pool, `INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id)
		VALUES ('uo', 'U-1', 1, 'new', now(), 0), ('uo', 'U-2', 2, 'new', now(), 0)`)
	site.Drop(t, "orders-1.csv", goodRows("U", 3))
	site.Drop(t, "orders-2.csv", goodRows("V", 1))
	r.poll("uo")
	m := byName(files(t, pool, "uo"))
	if f := m["orders-1.csv"]; f.State != "archived" || f.Applied != 2 || f.Rejected != 1 || f.Total != 3 {
		t.Fatalf("first file %+v, want 2 applied and 1 rejected", f)
	}
	if f := m["orders-2.csv"]; f.State != "archived" || f.Rejected != 1 || f.Rejects == "" {
		t.Fatalf("second file %+v, want 1 rejected with a rejects report", f)
	}
	if got := issues(t, pool, m["orders-1.csv"].ID); len(got) != 1 || got[0] != "4:not_found:rejected" {
		t.Fatalf("row issues %v, want line 4 not_found rejected", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'uo'`); n != 2 {
		t.Fatalf("target holds %d rows, want the 2 it had", n)
	}
	if a, _ := amountOf(t, pool, "orders", "uo", "U-2"); a != "20.02" {
		t.Fatalf("U-2 = %s, want 20.02", a)
	}
	if got := grouped(r, "uo", "grouped"); got != 0 {
		t.Fatalf("%v update_only files went through a group", got)
	}
}

func receiptOf(t *testing.T, site *testenv.Site, f fileRow) sitefile.Receipt {
	t.Helper()
	return receipt(t, site, f.Receipt)
}

// snapshot: the file is the partner's complete set. Rows of the feed's
// earlier files whose key it lacks are deleted in its last transaction
// and counted apart from its rows (receipt: deleted); a row intake never
// wrote stays, and a row edited outside intake stays and is told
// (receipt: delete_kept_outside_edit; the ledger; intake_rows_held_total).
func TestSnapshotDeletesRowsAbsentFromTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "sn")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("S", 5))
	r.poll("sn")
	exec(t, pool, `INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('sn', 'HAND-1', 1, 'new', now(), 0)`)
	exec(t, pool, `UPDATE orders SET amount = 7 WHERE partner_id = 'sn' AND order_id = 'S-3'`)
	site.Drop(t, "orders-2.csv", header+ordersLine("S", 1, "")+ordersLine("S", 2, "5.00")+ordersLine("S", 6, ""))
	r.poll("sn")
	f2 := files(t, pool, "sn")[1]
	if f2.State != "archived" || f2.Total != 3 || f2.Applied != 2 || f2.Unchanged != 1 {
		t.Fatalf("second file %+v, want 3 rows: 2 applied, 1 unchanged", f2)
	}
	var keys []string
	rs, err := pool.Query(context.Background(), `SELECT order_id FROM orders WHERE partner_id = 'sn' ORDER BY order_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var k string
		rs.Scan(&k)
		keys = append(keys, k)
	}
	if strings.Join(keys, ",") != "HAND-1,S-1,S-2,S-3,S-6" {
		t.Fatalf("target holds %v, want S-4 and S-5 deleted, the hand row and the edited S-3 kept", keys)
	}
	rc := receiptOf(t, site, f2)
	if rc.Rows.Deleted != 2 || rc.Rows.DeleteKept != 1 || rc.Rows.Total != 3 || rc.Rows.Applied+rc.Rows.Unchanged+rc.Rows.Rejected+rc.Rows.Conflict != rc.Rows.Total {
		t.Fatalf("receipt rows %+v, want 2 deleted, the edited S-3 told as kept, and totals that reconcile", rc.Rows)
	}
	if n := count(t, pool, `SELECT rows_delete_kept FROM file_intake WHERE intake_id = $1`, f2.ID); n != 1 {
		t.Fatalf("the ledger counts %d rows kept from the sweep, want 1", n)
	}
	if got := testutil.ToFloat64(r.d.Metrics().RowsHeld.WithLabelValues("sn", "outside_edit")); got != 1 {
		t.Fatalf("intake_rows_held_total{outside_edit} = %v, want 1 (the kept S-3)", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_snapshot_key`); n != 0 {
		t.Fatalf("%d snapshot keys left behind", n)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Rows.WithLabelValues("sn", "deleted")); got != 2 {
		t.Fatalf("intake_rows_total{deleted} = %v, want 2", got)
	}

	// a snapshot with a rejected row deletes nothing
	site.Drop(t, "orders-3.csv", header+ordersLine("S", 1, "")+"S-2,bad,not-a-number,paid,2026-11-01T10:00:00Z,1\n")
	r.poll("sn")
	f3 := files(t, pool, "sn")[2]
	if f3.State != "archived" || f3.Rejected != 1 || receiptOf(t, site, f3).Rows.Deleted != 0 {
		t.Fatalf("third file %+v, want 1 rejected and nothing deleted", f3)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sn'`); n != 5 {
		t.Fatalf("target holds %d rows after a snapshot with a rejected row, want the 5 it had", n)
	}
}

// snapshot with deleted_at: absent rows are marked, not deleted, once; a
// marked row that comes back is cleared. (Without the guard: the staged
// insert of new keys carries no hash.)
func TestSnapshotMarksDeletedAt(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `ALTER TABLE orders ADD COLUMN gone_at timestamptz`)
	site := testenv.NewSite(t, "sm")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
	site.Config.Feeds[0].DeletedAt = "gone_at"
	site.Config.Feeds[0].OnOutsideEdit = partners.OutsideEditOverwrite // unguarded: new keys staged for their keys alone
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("D", 3))
	r.poll("sm")
	site.Drop(t, "orders-2.csv", goodRows("D", 1))
	r.poll("sm")
	site.Drop(t, "orders-3.csv", goodRows("D", 2))
	r.poll("sm")
	fs := files(t, pool, "sm")
	if d2, d3 := receiptOf(t, site, fs[1]).Rows.Deleted, receiptOf(t, site, fs[2]).Rows.Deleted; d2 != 2 || d3 != 0 {
		t.Fatalf("deleted %d then %d, want 2 then 0 (D-3 marked once)", d2, d3)
	}
	if f := fs[2]; f.Applied != 1 || f.Unchanged != 1 {
		t.Fatalf("third file %+v, want D-2 back (applied) and D-1 unchanged", f)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sm' AND gone_at IS NOT NULL`); got != 1 {
		t.Fatalf("%d rows marked, want D-3 alone", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sm' AND order_id = 'D-3' AND gone_at IS NOT NULL`); got != 1 {
		t.Fatal("D-3 is not the marked row")
	}
}

// A snapshot keyed by a numeric without a scale: the file's 1.50 is the
// stored 1.5's key (the merge matches them), so the sweep leaves that row;
// only the key the file lacks goes. The key text recorded for the sweep
// keeps a numeric's scale, so it holds because the row checks write every
// decimal in one form (no trailing zeros), whatever the file wrote, and
// the look-up compares the rows in that form.
func TestSnapshotNumericKeyOfAnotherScaleIsTheSameKey(t *testing.T) {
	_, pool := testenv.DB(t)
	exec(t, pool, `CREATE TABLE orders_num (partner_id text NOT NULL, order_id numeric NOT NULL, email text, amount numeric(12,2) NOT NULL,
		status text NOT NULL, placed_at timestamptz NOT NULL, qty integer, last_intake_id bigint NOT NULL, PRIMARY KEY (partner_id, order_id))`)
	site := testenv.NewSite(t, "nk")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
	site.Config.Feeds[0].Target = "orders_num"
	site.Config.Feeds[0].Columns[0] = partners.Column{Name: "order_id", Type: partners.TypeDecimal, Scale: 3, Precision: 12, Required: true}
	r := newRig(t, pool, "w1", site)
	line := func(id string) string { return id + ",a@example.com,1.00,paid,2026-11-01T10:00:00Z,1\n" }
	site.Drop(t, "orders-1.csv", header+line("1.5")+line("2")+line("3"))
	r.poll("nk")
	site.Drop(t, "orders-2.csv", header+line("1.50")+line("2.000"))
	r.poll("nk")
	f := files(t, pool, "nk")[1]
	if f.State != "archived" || f.Unchanged != 2 {
		t.Fatalf("second file %+v, want archived with 2 unchanged", f)
	}
	if d := receiptOf(t, site, f).Rows.Deleted; d != 1 {
		t.Fatalf("deleted %d, want 1 (order 3)", d)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders_num WHERE partner_id = 'nk' AND order_id IN (1.5, 2)`); got != 2 {
		t.Fatalf("%d of orders 1.5 and 2 left, want both (the file holds them)", got)
	}
}

// A snapshot whose last chunk fails after its sweep ran resumes from the
// chunks it committed (their keys kept with them) and deletes exactly the
// absent rows, once.
func TestSnapshotStoppedMidApplyDeletesOnce(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "sk")
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
	site.Config.Feeds[0].ChunkRows = 2
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("K", 8))
	r.poll("sk")
	if err := fault.Set("apply:mid_chunk=error@3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	site.Drop(t, "orders-2.csv", goodRows("K", 5)) // chunks of 2, 2, 1: the last fails once
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.PollOnce(ctx, "sk"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("first poll: %v, want the injected fault", err)
	}
	if f := files(t, pool, "sk")[1]; f.State != "applying" || f.Chunks != 2 {
		t.Fatalf("after the failed last chunk: %+v, want applying with 2 chunks", f)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sk'`); n != 8 {
		t.Fatalf("the failed last chunk deleted rows: %d left, want 8", n)
	}
	fault.Set("")
	r.poll("sk")
	f2 := files(t, pool, "sk")[1]
	if f2.State != "archived" || f2.Unchanged != 5 || f2.Chunks != 3 {
		t.Fatalf("second file %+v, want archived, 5 unchanged in 3 chunks", f2)
	}
	if d := receiptOf(t, site, f2).Rows.Deleted; d != 3 {
		t.Fatalf("deleted %d, want 3 (K-6..K-8)", d)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'sk'`); n != 5 {
		t.Fatalf("target holds %d rows, want K-1..K-5", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_snapshot_key`); n != 0 {
		t.Fatalf("%d snapshot keys left behind", n)
	}
}

// The feed configuration that planned a file is recorded with it
// (feed_sha256), and a file is never applied under two: a resume that
// finds another configuration plans the file again when none of its
// chunks is applied, and otherwise fails it (mapping_changed) without
// applying another chunk; a release then applies it whole under the new
// configuration.
func TestMappingIsFrozenWithTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	for _, tc := range []struct {
		partner  string
		failAt   int
		replans  bool
		chunksAt int64
	}{{"fz0", 1, true, 0}, {"fz1", 2, false, 1}} {
		site := testenv.NewSite(t, tc.partner)
		site.Config.Feeds[0].ChunkRows = 2
		r1 := newRig(t, pool, "w1", site)
		if err := fault.Set(fmt.Sprintf("apply:mid_chunk=error@%d", tc.failAt)); err != nil {
			t.Fatal(err)
		}
		site.Drop(t, "orders-1.csv", goodRows("Z", 5))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := r1.d.PollOnce(ctx, tc.partner); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("%s: first poll %v, want the injected fault", tc.partner, err)
		}
		cancel()
		fault.Set("")
		old := site.Validated(t).Feeds[0].Hash()
		var recorded string
		if err := pool.QueryRow(context.Background(), `SELECT feed_sha256 FROM file_intake WHERE partner_id = $1`, tc.partner).Scan(&recorded); err != nil || recorded != old {
			t.Fatalf("%s: feed_sha256 %q (%v), want the planning configuration's %s", tc.partner, recorded, err, old)
		}
		if f := files(t, pool, tc.partner)[0]; f.State != "applying" || f.Chunks != tc.chunksAt {
			t.Fatalf("%s: %+v, want applying with %d chunks", tc.partner, f, tc.chunksAt)
		}
		r1.d.Stop()

		// the replica restarts with another configuration of the feed
		site.Config.Feeds[0].ChunkRows = 10
		r2 := newRig(t, pool, "w1", site)
		r2.poll(tc.partner)
		f := files(t, pool, tc.partner)[0]
		if tc.replans {
			if f.State != "archived" || f.Applied != 5 || f.Chunks != 1 {
				t.Fatalf("%s: %+v, want planned again and applied in 1 chunk of the new configuration", tc.partner, f)
			}
			if err := pool.QueryRow(context.Background(), `SELECT feed_sha256 FROM file_intake WHERE partner_id = $1`, tc.partner).Scan(&recorded); err != nil || recorded != site.Validated(t).Feeds[0].Hash() {
				t.Fatalf("%s: feed_sha256 %q after the new plan, want the new configuration's", tc.partner, recorded)
			}
			r2.d.Stop() // the next case's first replica is w1 again
			continue
		}
		if f.State != "failed_terminal" || f.Reason != "mapping_changed" || f.Chunks != 1 {
			t.Fatalf("%s: %+v, want failed_terminal mapping_changed with its 1 chunk", tc.partner, f)
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, tc.partner); n != 2 {
			t.Fatalf("%s: target holds %d rows, want the 2 of the one chunk applied before the change", tc.partner, n)
		}
		// released, the file starts over as a whole under the new configuration
		ctx = context.Background()
		if err := ops.Release(ctx, pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "mapping changed on purpose",
			Partners: []string{tc.partner}, Worker: intake.OpsWorker("ops")}); err != nil {
			t.Fatal(err)
		}
		r2.reconcileOnce(site)
		r2.poll(tc.partner)
		f = files(t, pool, tc.partner)[0]
		if f.State != "archived" || f.Total != 5 || f.Applied != 3 || f.Unchanged != 2 || f.Chunks != 1 {
			t.Fatalf("%s: released: %+v, want archived in 1 chunk: 3 applied, 2 unchanged", tc.partner, f)
		}
	}
}
