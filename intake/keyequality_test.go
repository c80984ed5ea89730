package intake_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// Targets whose key equality is not byte equality (intake/target/keys.go):
// a column of a nondeterministic ICU collation, a citext column and a
// unique index of such a collation, where 'X-1' and 'x-1' are one key.
var caseBlindKeys = []struct{ name, ddl string }{
	{"nondeterministic collation", `CREATE COLLATION IF NOT EXISTS intake_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		ALTER TABLE orders ALTER COLUMN order_id TYPE text COLLATE intake_test_ci`},
	{"citext", `CREATE EXTENSION IF NOT EXISTS citext; ALTER TABLE orders ALTER COLUMN order_id TYPE citext`},
	// a plain text column whose unique index (the ON CONFLICT arbiter)
	// compares it under such a collation
	{"unique index of a nondeterministic collation", `CREATE COLLATION IF NOT EXISTS intake_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		ALTER TABLE orders DROP CONSTRAINT orders_partner_id_order_id_key;
		CREATE UNIQUE INDEX orders_ci ON orders (partner_id, order_id COLLATE intake_test_ci)`},
}

func caseBlindDB(t *testing.T, ddl string) *pgxpool.Pool {
	t.Helper()
	_, pool := testenv.DB(t)
	exec(t, pool, ddl)
	return pool
}

// A file that holds one key twice as the target compares keys ('X-1' and
// 'x-1' of a case-blind key) is a file with a repeated key: the later line
// wins, the earlier is rejected as duplicate_key, as for a key repeated
// byte for byte. Before, intake saw two keys: the merge failed (ON
// CONFLICT cannot affect a row twice) and the file was held for good, or
// its receipt counted a line unchanged that the next line overwrote.
func TestAKeyRepeatedAsTheTargetComparesKeysIsADuplicateKey(t *testing.T) {
	for _, tc := range caseBlindKeys {
		t.Run(tc.name, func(t *testing.T) {
			pool := caseBlindDB(t, tc.ddl)
			site := testenv.NewSite(t, "ck")
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-new.csv", header+
				"X-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
				"D-2,a@b.io,2.00,new,2026-11-01T00:00:00Z,1\n"+
				"x-1,a@b.io,3.00,paid,2026-11-01T00:00:00Z,1\n")
			r.poll("ck")
			f := files(t, pool, "ck")[0]
			if f.State != "archived" || f.Total != 3 || f.Applied != 2 || f.Rejected != 1 || f.Unchanged != 0 {
				t.Fatalf("got %+v, want archived: 2 applied, 1 rejected", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE lower(order_id::text) = 'x-1' AND amount = 3.00 AND status = 'paid'`); n != 1 {
				t.Fatal("the last line of the repeated key did not win")
			}
			rel, _ := filepath.Rel(site.Root, f.Rejects)
			if got := site.Read(t, rel); !strings.Contains(got, "2,,duplicate_key,rejected") {
				t.Fatalf("rejects.csv:\n%s", got)
			}
			rc := receipt(t, site, f.Receipt)
			if rc.Outcome != ledger.OutcomeAcceptedWithRejects || rc.Rows.Applied != 2 || rc.Rows.Rejected != 1 {
				t.Fatalf("receipt %+v, want accepted_with_rejects: 2 applied, 1 rejected", rc)
			}

			// the key exists, a changed line comes first and the stored
			// values again last: the last line wins (the row stays as it
			// is), the first is the duplicate
			site.Drop(t, "orders-again.csv", header+
				"d-2,a@b.io,9.00,paid,2026-11-01T00:00:00Z,1\n"+
				"D-2,a@b.io,2.00,new,2026-11-01T00:00:00Z,1\n")
			r.poll("ck")
			f = files(t, pool, "ck")[1]
			if f.State != "archived" || f.Total != 2 || f.Rejected != 1 || f.Unchanged != 1 || f.Applied != 0 {
				t.Fatalf("got %+v, want archived: 1 unchanged, 1 rejected", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE lower(order_id::text) = 'd-2' AND amount = 2.00 AND status = 'new'`); n != 1 {
				t.Fatal("the row was changed by a line a later one repeats")
			}
			if n := count(t, pool, `SELECT count(*) FROM orders`); n != 2 {
				t.Fatalf("%d target rows, want 2", n)
			}
		})
	}
}

// A snapshot that writes a key as the target compares it ('s-1' over a
// stored 'S-1') holds that row: the keys it records are the target's own,
// and its sweep deletes only rows whose key the file lacks. Before, the
// key was recorded as written and the row just written was deleted.
func TestASnapshotKeepsARowItsFileNamesAsTheTargetComparesKeys(t *testing.T) {
	for _, tc := range caseBlindKeys {
		t.Run(tc.name, func(t *testing.T) {
			pool := caseBlindDB(t, tc.ddl)
			site := testenv.NewSite(t, "sk")
			site.Config.Feeds[0].Mode = partners.ModeSnapshot
			site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-1.csv", goodRows("S", 4))
			r.poll("sk")
			site.Drop(t, "orders-2.csv", header+ordersLine("s", 1, "")+ordersLine("S", 2, "")+ordersLine("S", 3, ""))
			r.poll("sk")
			f := files(t, pool, "sk")[1]
			if f.State != "archived" || f.Total != 3 || f.Unchanged != 3 {
				t.Fatalf("second file %+v, want archived: 3 unchanged", f)
			}
			var keys []string
			rs, err := pool.Query(context.Background(), `SELECT order_id::text FROM orders ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rs.Next() {
				var k string
				if err := rs.Scan(&k); err != nil {
					t.Fatal(err)
				}
				keys = append(keys, k)
			}
			if err := rs.Err(); err != nil {
				t.Fatal(err)
			}
			if strings.Join(keys, ",") != "S-1,S-2,S-3" {
				t.Fatalf("target holds %v, want S-4 alone deleted", keys)
			}
			if rc := receipt(t, site, f.Receipt); rc.Rows.Deleted != 1 {
				t.Fatalf("receipt rows %+v, want 1 deleted", rc.Rows)
			}
		})
	}
}

// In a group of small files, a file that repeats a key as the target
// compares keys leaves the group (repeated_key: only the dedupe could tell)
// and ends as it would alone; the group's other files go through it.
func TestAGroupSendsOnAFileRepeatingAKeyAsTheTargetComparesKeys(t *testing.T) {
	for _, tc := range caseBlindKeys {
		t.Run(tc.name, func(t *testing.T) {
			pool := caseBlindDB(t, tc.ddl)
			site := testenv.NewSite(t, "gk")
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-g1.csv", goodRows("G1", 5))
			site.Drop(t, "orders-dk.csv", header+
				"K-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
				"k-1,a@b.io,3.00,paid,2026-11-01T00:00:00Z,1\n")
			site.Drop(t, "orders-g2.csv", goodRows("G2", 5))
			r.poll("gk")
			if got := grouped(r, "gk", "grouped"); got != 3 {
				t.Fatalf("%v files went through a group, want 3", got)
			}
			if got := grouped(r, "gk", intake.LeftRepeatedKey); got != 1 {
				t.Fatalf("%v files left the group as %s, want 1", got, intake.LeftRepeatedKey)
			}
			m := byName(files(t, pool, "gk"))
			dk := m["orders-dk.csv"]
			if dk.State != "archived" || dk.Applied != 1 || dk.Rejected != 1 {
				t.Fatalf("orders-dk.csv: %+v, want archived: 1 applied, 1 rejected", dk)
			}
			rel, _ := filepath.Rel(site.Root, dk.Rejects)
			if got := site.Read(t, rel); !strings.Contains(got, "2,,duplicate_key,rejected") {
				t.Fatalf("orders-dk.csv's rejects.csv:\n%s", got)
			}
			for _, name := range []string{"orders-g1.csv", "orders-g2.csv"} {
				if f := m[name]; f.State != "archived" || f.Applied != 5 {
					t.Fatalf("%s: %+v, want archived with 5 applied", name, f)
				}
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE lower(order_id::text) = 'k-1' AND amount = 3.00`); n != 1 {
				t.Fatal("the last line of the repeated key did not win")
			}
			if n := count(t, pool, `SELECT count(*) FROM orders`); n != 11 {
				t.Fatalf("%d target rows, want 11", n)
			}
		})
	}
}

// The other way round: a column of a nondeterministic collation whose
// unique index (the ON CONFLICT arbiter) compares it byte for byte (under
// "C", or under the database's default named in the index) holds 'Y-1'
// and 'y-1' as two rows, and a file holding both applies both: the keys
// are compared as the index compares them, not as the column does.
func TestKeysTheUniqueIndexComparesByBytesAreTwo(t *testing.T) {
	for _, coll := range []string{`"C"`, `"default"`} {
		t.Run(coll, func(t *testing.T) {
			pool := caseBlindDB(t, `CREATE COLLATION IF NOT EXISTS intake_test_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
		ALTER TABLE orders DROP CONSTRAINT orders_partner_id_order_id_key;
		ALTER TABLE orders ALTER COLUMN order_id TYPE text COLLATE intake_test_ci;
		CREATE UNIQUE INDEX orders_bytes ON orders (partner_id, order_id COLLATE `+coll+`)`)
			site := testenv.NewSite(t, "bk")
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-d.csv", header+"D-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n")
			r.poll("bk")
			// D-1 exists: the file is merged (not COPYed straight in), where
			// the dedupe and the probe compare its keys
			site.Drop(t, "orders-y.csv", header+
				"D-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
				"Y-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n"+
				"y-1,a@b.io,3.00,paid,2026-11-01T00:00:00Z,1\n"+
				"d-1,a@b.io,4.00,paid,2026-11-01T00:00:00Z,1\n")
			r.poll("bk")
			f := files(t, pool, "bk")[1]
			if f.State != "archived" || f.Total != 4 || f.Applied != 3 || f.Unchanged != 1 || f.Rejected != 0 {
				t.Fatalf("got %+v, want archived: 3 applied, 1 unchanged", f)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE order_id COLLATE "C" IN ('Y-1', 'y-1', 'D-1', 'd-1')`); n != 4 {
				t.Fatalf("%d rows for Y-1, y-1, D-1 and d-1, want 4", n)
			}
		})
	}
}

// A snapshot's plan counts its deletes as its apply makes them: a row the
// file names in other bytes ('s-1' over a stored 'S-1') is no delete, so
// max_delete_ratio does not hold a file that deletes nothing.
func TestASnapshotsPlanCountsDeletesAsTheTargetComparesKeys(t *testing.T) {
	for _, tc := range caseBlindKeys {
		t.Run(tc.name, func(t *testing.T) {
			pool := caseBlindDB(t, tc.ddl)
			site := testenv.NewSite(t, "pk")
			site.Config.Feeds[0].Mode = partners.ModeSnapshot
			site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true} // the sweep itself, not its guard
			site.Config.Feeds[0].Approval = &partners.Approval{MaxDeleteRatio: ratio(0.5)}
			r := newRig(t, pool, "w1", site)
			site.Drop(t, "orders-1.csv", goodRows("P", 3))
			r.poll("pk")
			site.Drop(t, "orders-2.csv", header+ordersLine("p", 1, "")+ordersLine("p", 2, "")+ordersLine("P", 3, ""))
			r.poll("pk")
			f := files(t, pool, "pk")[1]
			_, c := planOf(t, pool, "pk", f.ID)
			if f.State != "archived" || c.Deletes != 0 || c.Unchanged != 3 {
				t.Fatalf("snapshot %+v plan %+v, want archived with no delete planned", f, c)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders`); n != 3 {
				t.Fatalf("%d rows, want 3", n)
			}
		})
	}
}
