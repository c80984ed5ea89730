package target

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// The look-up of rows a target holds as they are leaves out exactly the
// rows whose every field is the stored value, for this partner, and keeps
// every other one: a changed value, a NULL on either side, a new key, a
// key only another partner holds, a microsecond, a row an insert_only
// feed's other writer wrote; found by range or, far apart, key by key.
func TestUnchangedKeepsEveryRowTheTargetDoesNotHoldAsItIs(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE same_t (partner_id text NOT NULL, id bigint NOT NULL, code varchar(10), amount numeric(12,2),
		at timestamptz, d date, note text, last_intake_id bigint NOT NULL, UNIQUE (partner_id, id));
		CREATE TABLE same_k (partner_id text NOT NULL, region text NOT NULL, n integer NOT NULL, v text, last_intake_id bigint NOT NULL,
		PRIMARY KEY (partner_id, region, n))`); err != nil {
		t.Fatal(err)
	}
	cols := []partners.Column{{Name: "id", Type: partners.TypeInteger}, {Name: "code", Type: partners.TypeText, MaxLength: 10},
		{Name: "amount", Type: partners.TypeDecimal, Scale: 2, Precision: 12}, {Name: "at", Type: partners.TypeTimestamp},
		{Name: "d", Type: partners.TypeDate}, {Name: "note", Type: partners.TypeText}}
	load := func(f *partners.Feed) *Table {
		t.Helper()
		tgt, err := Load(ctx, pool, f)
		if err != nil {
			t.Fatal(err)
		}
		if !tgt.LooksUpUnchanged() {
			t.Fatalf("%s: the look-up is not used", f.Target)
		}
		return tgt
	}
	// encode: rows as the chunk encodes them, nil for NULL
	encode := func(tgt *Table, rows [][]*string) ([]byte, []int) {
		t.Helper()
		var out []byte
		var ends []int
		for _, row := range rows {
			for i, v := range row {
				if v == nil {
					out = binary.BigEndian.AppendUint32(out, 0xffffffff)
					continue
				}
				at := len(out)
				out = append(out, 0, 0, 0, 0)
				var err error
				if out, err = tgt.enc[i](out, *v); err != nil {
					t.Fatal(err)
				}
				binary.BigEndian.PutUint32(out[at:], uint32(len(out)-at-4))
			}
			ends = append(ends, len(out))
		}
		return out, ends
	}
	s := func(v string) *string { return &v }
	keep := func(tgt *Table, partner string, writer int64, rows [][]*string) []int {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		b, ends := encode(tgt, rows)
		got, err := tgt.NewUnchanged().Keep(ctx, tx, partner, writer, b, ends)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(got)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO same_t VALUES
		('p', 1, 'A', 10.50, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('p', 2, 'B', 20.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('p', 3, 'C', 30.00, '2026-01-02T03:04:05Z', '2026-01-02', NULL, 7),
		('p', 4, 'D', 40.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('p', 5, 'E', 1.50, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('p', 6, 'F', 60.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('q', 7, 'G', 70.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7),
		('p', 8, 'H', 80.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 8)`); err != nil {
		t.Fatal(err)
	}
	row := func(id, code, amount, at string, note *string) []*string {
		return []*string{s(id), s(code), s(amount), s(at), s("2026-01-02"), note}
	}
	ts := "2026-01-02T03:04:05Z"
	rows := [][]*string{
		row("1", "A", "10.50", ts, s("x")),                            // 0: as stored
		row("2", "B", "20.01", ts, s("x")),                            // 1: amount changed
		row("3", "C", "30.00", ts, s("x")),                            // 2: NULL stored, a value sent
		row("4", "D", "40.00", ts, nil),                               // 3: a value stored, NULL sent
		row("5", "E", "1.5", ts, s("x")),                              // 4: 1.5 into numeric(12,2) is the stored 1.50
		row("6", "F", "60.00", "2026-01-02T03:04:05.000001Z", s("x")), // 5: a microsecond later
		row("7", "G", "70.00", ts, s("x")),                            // 6: only partner q holds key 7
		row("9", "I", "90.00", ts, s("x")),                            // 7: a new key
		row("8", "H", "80.00", ts, s("x")),                            // 8: as stored (by writer 8)
	}
	upsert := load(&partners.Feed{Name: "u", Target: "same_t", Key: []string{"id"}, Columns: cols})
	if got, want := keep(upsert, "p", 100, rows), []int{1, 2, 3, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("upsert: kept rows %v, want %v", got, want)
	}
	// insert_only: an existing row is unchanged only when this writer wrote it
	insertOnly := load(&partners.Feed{Name: "i", Target: "same_t", Key: []string{"id"}, Columns: cols, Mode: partners.ModeInsertOnly})
	if got, want := keep(insertOnly, "p", 8, rows), []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("insert_only as writer 8: kept rows %v, want %v", got, want)
	}
	// keys far apart, many rows between them: the capped range read
	// gives way to looking each key up
	if _, err := pool.Exec(ctx, `INSERT INTO same_t SELECT 'p', g, 'Z', 1.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 7 FROM generate_series(100, 200) g`); err != nil {
		t.Fatal(err)
	}
	far := [][]*string{row("1", "A", "10.50", ts, s("x")), row("200", "Z", "1.00", ts, s("x")), row("150", "Z", "1.01", ts, s("x"))}
	if got, want := keep(upsert, "p", 100, far), []int{2}; !slices.Equal(got, want) {
		t.Fatalf("sparse range: kept rows %v, want %v", got, want)
	}
	// nothing of another partner's is read: p's rows are not q's
	if got, want := keep(upsert, "q", 100, far), []int{0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("partner q: kept rows %v, want %v", got, want)
	}
	// insert_only among many rows other intakes wrote in the range: the
	// writer's own rows at both ends are found (the read is capped by
	// rows read, not by rows of this writer)
	if _, err := pool.Exec(ctx, `INSERT INTO same_t SELECT 'p', g, 'W', 2.00, '2026-01-02T03:04:05Z', '2026-01-02', 'x', 9 FROM generate_series(1000, 1100) g;
		UPDATE same_t SET last_intake_id = 8 WHERE partner_id = 'p' AND id IN (1000, 1100)`); err != nil {
		t.Fatal(err)
	}
	ends2 := [][]*string{row("1000", "W", "2.00", ts, s("x")), row("1100", "W", "2.00", ts, s("x")), row("1050", "W", "2.00", ts, s("x"))}
	if got, want := keep(insertOnly, "p", 8, ends2), []int{2}; !slices.Equal(got, want) {
		t.Fatalf("insert_only among other writers' rows: kept rows %v, want %v", got, want)
	}
	// every type a first key column can have here
	for i, typ := range []struct{ pg, feed, a, b string }{
		{"varchar(20)", partners.TypeText, "k-a", "k-b"}, {"integer", partners.TypeInteger, "7", "8"},
		{"smallint", partners.TypeInteger, "-3", "4"}, {"numeric(10,2)", partners.TypeDecimal, "1.25", "2.50"},
		{"date", partners.TypeDate, "2026-01-01", "2026-01-02"},
		{"timestamptz", partners.TypeTimestamp, "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"},
		{"timestamp", partners.TypeTimestamp, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"},
	} {
		table := fmt.Sprintf("same_type_%d", i)
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (partner_id text NOT NULL, k %[2]s NOT NULL, v text, last_intake_id bigint NOT NULL, UNIQUE (partner_id, k));
			INSERT INTO %[1]s VALUES ('p', '%[3]s', 'a', 7), ('p', '%[4]s', 'b', 7)`, table, typ.pg, typ.a, typ.b)); err != nil {
			t.Fatal(err)
		}
		key := partners.Column{Name: "k", Type: typ.feed, Required: true}
		if typ.feed == partners.TypeDecimal {
			key.Scale, key.Precision = 2, 10
		}
		tgt := load(&partners.Feed{Name: table, Target: table, Key: []string{"k"}, Columns: []partners.Column{key, {Name: "v", Type: partners.TypeText}}})
		rows := [][]*string{{s(typ.a), s("a")}, {s(typ.b), s("changed")}}
		if got, want := keep(tgt, "p", 100, rows), []int{1}; !slices.Equal(got, want) {
			t.Errorf("a %s key: kept rows %v, want %v", typ.pg, got, want)
		}
	}
	// a key of two columns: both must match, the range is on the first
	if _, err := pool.Exec(ctx, `INSERT INTO same_k VALUES ('p', 'eu', 1, 'a', 7), ('p', 'eu', 2, NULL, 7), ('p', 'us', 1, 'a', 7)`); err != nil {
		t.Fatal(err)
	}
	two := load(&partners.Feed{Name: "k", Target: "same_k", Key: []string{"region", "n"}, Columns: []partners.Column{
		{Name: "region", Type: partners.TypeText}, {Name: "n", Type: partners.TypeInteger}, {Name: "v", Type: partners.TypeText}}})
	kRows := [][]*string{{s("eu"), s("1"), s("a")}, {s("eu"), s("2"), nil}, {s("us"), s("2"), s("a")}, {s("us"), s("1"), s("b")}, {s("eu"), s("3"), nil}}
	if got, want := keep(two, "p", 100, kRows), []int{2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("two-column key: kept rows %v, want %v", got, want)
	}
	// and what it compares is what the merge does: the kept rows are the
	// ones the merge writes or judges, the others it counts unchanged
	merge := func(tgt *Table, writer int64, rows [][]*string) (unchanged int64, written string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		// the conflicts' row issues name intakes this test has no file_intake rows for
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			t.Fatal(err)
		}
		if err := tgt.Stage(ctx, tx); err != nil {
			t.Fatal(err)
		}
		b, ends := encode(tgt, rows)
		payload := AppendCopyHeader(nil)
		start := 0
		for i, end := range ends {
			payload = binary.BigEndian.AppendUint16(payload, uint16(len(cols)+1))
			payload = binary.BigEndian.AppendUint32(payload, 8)
			payload = binary.BigEndian.AppendUint64(payload, uint64(i+1))
			payload = append(payload, b[start:end]...)
			start = end
		}
		if err := tgt.CopyStage(ctx, tx, AppendCopyTrailer(payload)); err != nil {
			t.Fatal(err)
		}
		m, err := tgt.Merge(ctx, tx, writer, "p", writer, len(rows), 0)
		if err != nil {
			t.Fatal(err)
		}
		r, err := tx.Query(ctx, `SELECT id FROM same_t WHERE partner_id = 'p' AND last_intake_id = $1 AND id < 100 ORDER BY id`, writer)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(r, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(rows)) - m.Applied - m.Conflict - m.NotFound, fmt.Sprint(ids)
	}
	if unchanged, written := merge(upsert, 100, rows); unchanged != 3 || written != "[2 3 4 6 7 9]" {
		t.Fatalf("upsert: the merge counts %d rows unchanged and writes ids %s; the look-up leaves out 3 and keeps [2 3 4 6 7 9]", unchanged, written)
	}
	// insert_only as writer 8: only id 8 is unchanged (the others exist as
	// other intakes wrote them, or are new: 7 for p, 9)
	if unchanged, written := merge(insertOnly, 8, rows); unchanged != 1 || written != "[7 8 9]" {
		t.Fatalf("insert_only: the merge counts %d rows unchanged and writes ids %s; want 1, and [7 8 9] (8 as it was)", unchanged, written)
	}
}

// A snapshot's rows left out of the merge have their keys recorded from
// the look-up's bytes, as the text the sweep computes from the target's
// rows: a key of two columns whose text depends on how it is written (a
// timestamp as epoch seconds, a numeric's scale).
func TestUnchangedRecordsASnapshotsLeftOutKeysAsTheSweepReadsThem(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE snap_k (partner_id text NOT NULL, at timestamptz NOT NULL, amount numeric(10,2) NOT NULL,
		d date, code varchar(8), v text, last_intake_id bigint NOT NULL, PRIMARY KEY (partner_id, at, amount));
		INSERT INTO snap_k VALUES ('p', '2026-01-02T03:04:05.5Z', 1.50, '2026-01-02', 'a', 'same', 7),
		('p', '1960-07-08T09:10:11Z', -3.00, '1960-07-08', 'b', 'same', 7), ('p', '2026-01-03T00:00:00Z', 2.00, '2026-01-03', 'c', 'old', 7)`); err != nil {
		t.Fatal(err)
	}
	tgt, err := Load(ctx, pool, &partners.Feed{Name: "s", Target: "snap_k", Key: []string{"at", "amount"}, Mode: partners.ModeSnapshot,
		Columns: []partners.Column{{Name: "at", Type: partners.TypeTimestamp, Required: true}, {Name: "amount", Type: partners.TypeDecimal, Scale: 2, Precision: 10, Required: true},
			{Name: "d", Type: partners.TypeDate}, {Name: "code", Type: partners.TypeText, MaxLength: 8}, {Name: "v", Type: partners.TypeText}}})
	if err != nil {
		t.Fatal(err)
	}
	if !tgt.LooksUpUnchanged() {
		t.Fatal("a snapshot's chunks are not looked up")
	}
	var b []byte
	var ends []int
	for _, row := range [][]string{{"2026-01-02T03:04:05.5Z", "1.5", "2026-01-02", "a", "same"}, {"1960-07-08T09:10:11Z", "-3", "1960-07-08", "b", "same"},
		{"2026-01-03T00:00:00Z", "2", "2026-01-03", "c", "new"}} {
		for i, v := range row {
			at := len(b)
			b = append(b, 0, 0, 0, 0)
			if b, err = tgt.enc[i](b, v); err != nil {
				t.Fatal(err)
			}
			binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
		}
		ends = append(ends, len(b))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil { // no file_intake row for intake 42
		t.Fatal(err)
	}
	u := tgt.NewUnchanged()
	keep, err := u.Keep(ctx, tx, "p", 42, b, ends)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keep, []int{2}) {
		t.Fatalf("kept rows %v, want [2]", keep)
	}
	if err := u.RecordLeftOut(ctx, tx, 42, b, ends); err != nil {
		t.Fatal(err)
	}
	r, err := tx.Query(ctx, fmt.Sprintf(`SELECT k.key, (SELECT count(*) FROM snap_k t WHERE %s = k.key) FROM intake_snapshot_key k WHERE k.intake_id = 42 ORDER BY 1`, tgt.keyText("t")))
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		Key     string
		Matches int64
	}
	got, err := pgx.CollectRows(r, pgx.RowToStructByPos[rec])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Matches != 1 || got[1].Matches != 1 {
		t.Fatalf("recorded keys %+v: want the two left-out rows' keys, each the key text of one target row", got)
	}
}
