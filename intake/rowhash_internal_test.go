package intake

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// The row hash intake computes as it encodes a row for COPY binary (the
// chunk's RowHasher) is bit for bit the hash the merge recomputes in SQL
// from the values PostgreSQL stored (RowHashSQL), for every target type
// the hash is computed for and their edge values: rows go COPY straight
// into a guarded target with the Go hash (the real chunk path), and
// through the staging table and the merge, which records the staged Go
// hash; then SQL recomputes each row's hash from its stored values. A mismatch would make
// the next file see every such row as edited outside intake.
func TestGoRowHashEqualsSQLRowHash(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	long := strings.Repeat("ab€😀", 3000)
	null := "\x00NULL" // a NULL cell in the cases below
	cases := []struct {
		name   string
		col    partners.Column
		pgType string
		values []string
	}{
		{"text", partners.Column{Type: partners.TypeText}, "text",
			[]string{"", null, "x", "héllo", "日本語😀", "tab\tnew\nline\r", `back\slash`, " lead and trail ", long}},
		{"varchar", partners.Column{Type: partners.TypeText}, "varchar", []string{"", null, "ünï", long}},
		{"varchar(5) clips trailing spaces", partners.Column{Type: partners.TypeText}, "varchar(5)",
			[]string{"", null, "abc", "abcde", "abcde   ", "é€😀ab ", "😀    ", "ab   "}},
		{"email", partners.Column{Type: partners.TypeEmail}, "varchar(254)", []string{"a@example.com", null}},
		{"enum", partners.Column{Type: partners.TypeEnum, Values: []string{"new", "paid"}}, "text", []string{"new", "paid", null}},
		{"smallint", partners.Column{Type: partners.TypeInteger}, "smallint", []string{"0", "-1", "1", "32767", "-32768", null}},
		{"integer", partners.Column{Type: partners.TypeInteger}, "integer", []string{"0", "-2147483648", "2147483647", null}},
		{"bigint", partners.Column{Type: partners.TypeInteger}, "bigint", []string{"0", "-9223372036854775808", "9223372036854775807", null}},
		{"integer into numeric", partners.Column{Type: partners.TypeInteger}, "numeric",
			[]string{"0", "-1", "10000", "-9223372036854775808", "9223372036854775807", null}},
		{"integer into numeric(20,4)", partners.Column{Type: partners.TypeInteger}, "numeric(20,4)", []string{"0", "-7", "123456789", null}},
		{"decimal into numeric", partners.Column{Type: partners.TypeDecimal, Scale: 40}, "numeric",
			[]string{"0", "-0", "0.0", "-0.000", "1", "-1", "0.5", "-0.5", "0.0001", "0.00001", "10000", "9999.9999", "1.50", "1.5000",
				"-99999.99", "100000000.01", "123456789012345678901234567890.123456789", "0.000000000000000000000000000001",
				"1" + strings.Repeat("0", 60), "-" + strings.Repeat("9", 100) + "." + strings.Repeat("9", 40), null}},
		{"decimal into numeric(12,2) rounds", partners.Column{Type: partners.TypeDecimal, Scale: 6}, "numeric(12,2)",
			[]string{"0", "-0", "10.5", "-3.1", "9999999999.99", "0.01", "1.005", "-1.005", "9.995", "-9.995", "0.004", "-0.004",
				"-0.001", "0.005", "99.999", "1.00449", "12345.6789", "9999999999.994", null}},
		{"decimal into numeric(10,0) rounds", partners.Column{Type: partners.TypeDecimal, Scale: 2}, "numeric(10,0)",
			[]string{"0.5", "-0.5", "0.4", "-0.4", "9999.5", "12", "-0.49", null}},
		{"decimal into numeric(8,8)", partners.Column{Type: partners.TypeDecimal, Scale: 8}, "numeric(8,8)",
			[]string{"0.12345678", "-0.00000001", "0", null}},
		{"date", partners.Column{Type: partners.TypeDate}, "date",
			[]string{"2000-01-01", "1999-12-31", "0001-01-01", "9999-12-31", "1960-02-29", "2026-02-28", null}},
		{"timestamptz", partners.Column{Type: partners.TypeTimestamp}, "timestamptz",
			[]string{"2026-01-02T03:04:05Z", "1999-12-31T23:59:59.999999Z", "1970-01-01T00:00:00Z", "2026-01-02T03:04:05.1234565Z",
				"2026-06-01T00:00:00.0000005Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "1900-03-04T05:06:07.5Z", null}},
		{"timestamp", partners.Column{Type: partners.TypeTimestamp}, "timestamp",
			[]string{"2026-01-02T03:04:05Z", "1960-07-08T09:10:11.25Z", "1999-12-31T23:59:59.9999995Z", null}},
		{"timestamptz(0) rounds", partners.Column{Type: partners.TypeTimestamp}, "timestamptz(0)",
			[]string{"2026-01-02T03:04:05.5Z", "1999-12-31T23:59:59.4999Z", "1960-07-08T09:10:11.5Z", "1960-07-08T09:10:11.49Z", null}},
		{"timestamp(3) rounds", partners.Column{Type: partners.TypeTimestamp}, "timestamp(3)",
			[]string{"2026-01-02T03:04:05.0005Z", "1950-01-02T03:04:05.0005Z", "1950-01-02T03:04:05.0004Z", null}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// first the key between the two hashed columns (one of them text
			// with NULLs: fields that are not adjacent), then the key first
			// (one run of adjacent fields)
			for _, keyFirst := range []bool{false, true} {
				table := fmt.Sprintf("rowhash_%d_%v", i, keyFirst)
				mustExec(t, pool, fmt.Sprintf(`CREATE TABLE %s (partner_id text NOT NULL, v %s, k integer NOT NULL, w text,
					last_intake_id bigint NOT NULL, intake_row_hash bigint, UNIQUE (partner_id, k))`, table, c.pgType))
				c.col.Name = "v"
				cols := []partners.Column{c.col, {Name: "k", Type: partners.TypeInteger}, {Name: "w", Type: partners.TypeText}}
				keyIdx := 1
				if keyFirst {
					cols[0], cols[1], keyIdx = cols[1], cols[0], 0
				}
				feed := &partners.Feed{Name: table, Target: table, Key: []string{"k"}, Columns: cols}
				tgt, err := target.Load(ctx, pool, feed)
				if err != nil {
					t.Fatal(err)
				}
				if !tgt.Binary() || tgt.RowHasher() == nil || tgt.StagedDirect() {
					t.Fatalf("binary %v, row hasher %v, staged %v: want intake's hash on the direct COPY",
						tgt.Binary(), tgt.RowHasher() != nil, tgt.StagedDirect())
				}
				ch := newChunk(maphash.MakeSeed(), len(c.values), tgt)
				for n, v := range c.values {
					w := []string{"w", "", "wé"}[n%3]
					vals, nulls := []string{v, strconv.Itoa(n), w}, []bool{v == null, false, n%3 == 1}
					if keyFirst {
						vals[0], vals[1], nulls[0], nulls[1] = vals[1], vals[0], nulls[1], nulls[0]
					}
					if err := ch.Add(int64(n+1), vals, nulls, []int{keyIdx}); err != nil {
						t.Fatalf("%q: %v", v, err)
					}
				}
				// straight into the target (a fresh chunk), then through the
				// staging table and the merge (each staged row carries its
				// hash, which the merge records)
				for _, merged := range []bool{false, true} {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if !merged {
							n, err := tgt.CopyDirect(ctx, tx, ch.DirectPayload("p", 1))
							if err == nil && n != int64(len(c.values)) {
								err = fmt.Errorf("%d rows copied, want %d", n, len(c.values))
							}
							return err
						}
						if _, err := tx.Exec(ctx, "DELETE FROM "+table); err != nil {
							return err
						}
						if err := tgt.Stage(ctx, tx); err != nil {
							return err
						}
						if err := tgt.CopyStage(ctx, tx, ch.StagePayload()); err != nil {
							return err
						}
						m, err := tgt.Merge(ctx, tx, 1, "p", 1, ch.rows(), 0)
						if err == nil && (m.Applied != int64(len(c.values)) || m.Fresh != m.Applied) {
							err = fmt.Errorf("merge %+v, want %d new rows applied", m, len(c.values))
						}
						return err
					})
					if err != nil {
						t.Fatal(err)
					}
					rs, err := pool.Query(ctx, fmt.Sprintf(`SELECT k, v::text, intake_row_hash, %s FROM %s t
						WHERE intake_row_hash IS NULL OR intake_row_hash <> %s ORDER BY k`, tgt.RowHashSQL("t"), table, tgt.RowHashSQL("t")))
					if err != nil {
						t.Fatal(err)
					}
					for rs.Next() {
						var k int
						var v *string
						var stored *int64
						var sql int64
						if err := rs.Scan(&k, &v, &stored, &sql); err != nil {
							t.Fatal(err)
						}
						t.Errorf("key first %v, merged %v: sent %q, stored %v: Go hash %v, SQL hash %d", keyFirst, merged, c.values[k], deref(v), deref(stored), sql)
					}
					rs.Close()
					if err := rs.Err(); err != nil {
						t.Fatal(err)
					}
					var n int
					if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != len(c.values) {
						t.Fatalf("%d rows, want %d", n, len(c.values))
					}
				}
			}
		})
	}

	// What the hash is not computed for keeps the staged path: a column
	// type without a binary encoder (COPY text), a numeric of negative
	// scale (its rounding is not the encoder's).
	mustExec(t, pool, `CREATE TABLE rowhash_uuid (partner_id text NOT NULL, k integer NOT NULL, v uuid,
		last_intake_id bigint NOT NULL, intake_row_hash bigint, UNIQUE (partner_id, k))`)
	mustExec(t, pool, `CREATE TABLE rowhash_negscale (partner_id text NOT NULL, k integer NOT NULL, v numeric(6,-2),
		last_intake_id bigint NOT NULL, intake_row_hash bigint, UNIQUE (partner_id, k))`)
	for table, col := range map[string]partners.Column{
		"rowhash_uuid":     {Name: "v", Type: partners.TypeText},
		"rowhash_negscale": {Name: "v", Type: partners.TypeDecimal, Scale: 2},
	} {
		tgt, err := target.Load(ctx, pool, &partners.Feed{Name: table, Target: table, Key: []string{"k"},
			Columns: []partners.Column{{Name: "k", Type: partners.TypeInteger}, col}})
		if err != nil {
			t.Fatal(err)
		}
		if tgt.RowHasher() != nil || !tgt.StagedDirect() || strings.Contains(tgt.RowHashSQL("t"), "record_send") {
			t.Fatalf("%s: row hasher %v, staged %v, hash %s: want the server's hash on the staged path",
				table, tgt.RowHasher() != nil, tgt.StagedDirect(), tgt.RowHashSQL("t"))
		}
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
