package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/partners"
)

// Rows the target already holds as they are. A chunk on the merge path is
// staged (COPY) and merged, and the merge compares each row with the
// target's (range scan, hash join, the comparison): for a replay, where
// every row is unchanged, that is all PostgreSQL's work and all of it
// serial on the chunk's connection (docs/performance.md). Reading
// the chunk's key range back in the binary send form instead is one index
// range scan, and intake compares the rows itself, byte for byte with the
// COPY binary fields it encoded, on its own core: a row whose every field
// is the stored value's send form is unchanged, and only the other rows
// are staged and merged. The merge still decides every row it gets: this
// only takes away rows it would have counted unchanged.
//
// Byte-equal means unchanged: a value is decoded from the same bytes
// whichever side sent them, and equal values are not distinct. The
// converse does not hold (numeric 1.5 and 1.50 are equal, their send
// forms differ; a value encoded off sendExact), so a row that differs by
// its bytes only goes to the merge, which counts it unchanged as before.
//
// It reads what the merge's own lookup reads, in the same transaction,
// with the same conditions: the row exists, no newer write matters to an
// unchanged row (it is never written), an insert_only feed counts an
// existing row as unchanged only when the writer itself wrote it, and a
// row a snapshot marked absent (deleted_at) is changed: its merge clears
// the mark. A snapshot records the key of every row of the file
// (RecordKeys, from the staging table): the keys of the rows left out are
// recorded from the look-up's own bytes (RecordLeftOut). A chunk whose
// key repeats keeps its rows for the dedupe.

// unchangedArray is the array type of each key type the look-up sends
// its chunk's first key column as (binary encoders only: see binary.go).
var unchangedArray = map[uint32]uint32{
	oidInt8: 1016, oidInt2: 1005, oidInt4: 1007, oidText: 1009, oidVarchar: 1015,
	oidDate: 1182, oidTimestamp: 1115, oidTimestamptz: 1185, oidNumeric: 1231,
}

// LooksUpUnchanged: the chunks of this target can be looked up for rows it
// already holds (Unchanged.Keep) before they are staged: COPY binary, a
// unique index that leads with (partner_id, first key column), so a
// chunk's key range is one index range scan, and key columns of types the
// look-up sends as arrays (unchangedArray).
func (t *Table) LooksUpUnchanged() bool { return t.unchangedRange != "" }

// keyOID is the type of the first key column.
func (t *tableDef) keyOID() uint32 { return t.oids[t.key0] }

// buildUnchanged writes the look-up ($1 partner, $2 the chunk's first key
// column values, $3 the cap on rows read, $4 the writer for insert_only):
// the target's rows in the chunk's key range, the feed's columns in file
// order, in the binary send form, and where a row's bytes alone do not
// tell (insert_only: who wrote it; a snapshot's deleted_at mark) whether
// it may count unchanged, as one more column (read by Keep, not filtered
// in SQL: a filter would let the capped read scan past every row it
// refuses). A snapshot's RecordLeftOut: $1 intake id, then one array per
// key column.
func (t *loadStatements) buildUnchanged() {
	if !t.binary || !t.rangeProbe || !t.exactKeys || t.collOverride[slices.Index(t.cols, t.key[0])] {
		// (keys the target compares its own way: its rows and the
		// chunk's are matched by their bytes, and a key the chunk repeats
		// in other bytes must reach the dedupe: keys.go; a first key its
		// index compares under another collation than its column's: the
		// look-up's range would not be the index's)
		return
	}
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	var cols, keyCols []string
	for _, c := range t.cols {
		cols = append(cols, "t."+q(c))
	}
	for _, k := range t.key {
		i := slices.Index(t.cols, k)
		if i < 0 {
			return
		}
		if _, ok := unchangedArray[t.oids[i]]; !ok {
			return
		}
		keyCols = append(keyCols, q(k))
		t.keyOrder = append(t.keyOrder, i)
	}
	switch {
	case t.mode == partners.ModeInsertOnly:
		cols, t.unchangedOK = append(cols, "t.last_intake_id = $4"), true
	case t.deletedAt != "":
		cols, t.unchangedOK = append(cols, "t."+t.deletedAt+" IS NULL"), true
	}
	if t.mode == partners.ModeSnapshot {
		var arrays []string
		for n := range t.key {
			arrays = append(arrays, fmt.Sprintf("pg_catalog.unnest($%d)", n+2))
		}
		t.unchangedKeysRecord = fmt.Sprintf(`INSERT INTO intake_snapshot_key (intake_id, key)
		SELECT $1, %s FROM ROWS FROM (%s) AS u(%s) ON CONFLICT DO NOTHING`, t.keyText("u"), strings.Join(arrays, ", "), strings.Join(keyCols, ", "))
	}
	k := q(t.key[0])
	// As the merge reads them (see build): the chunk's key range in one
	// index range scan, capped at $3 rows; when the cap is reached (the
	// range is sparse: other keys between the chunk's), each distinct
	// value of the first key column looked up in the index instead, capped
	// too (a first key column of few values, a region, may hold many rows
	// each). What is not read is left to the merge. Two statements rather
	// than one that chooses: a plan that holds both ways got a parallel
	// sequential scan for the second, whose workers start even when it is
	// not run (75 ms a chunk, measured).
	t.unchangedRange = fmt.Sprintf(`SELECT %s FROM %s t
		WHERE t.partner_id = $1 AND t.%s BETWEEN (SELECT pg_catalog.min(x) FROM pg_catalog.unnest($2) x) AND (SELECT pg_catalog.max(x) FROM pg_catalog.unnest($2) x)
		ORDER BY t.partner_id, t.%s LIMIT $3`, strings.Join(cols, ", "), t.table, k, k)
	t.unchangedKeys = fmt.Sprintf(`SELECT t.* FROM (SELECT DISTINCT x FROM pg_catalog.unnest($2) x) k, LATERAL (
		    SELECT %s FROM %s t WHERE t.partner_id = $1 AND t.%s = k.x LIMIT $3) t
		LIMIT $3`, strings.Join(cols, ", "), t.table, k)
	t.key0 = slices.Index(t.cols, t.key[0])
	for i, c := range t.cols {
		if slices.Contains(t.key, c) {
			t.keyIdx = append(t.keyIdx, i)
		}
	}
}

// Unchanged looks up a chunk's rows in the target (one per chunk: it keeps
// its buffers from chunk to chunk, and is not safe for concurrent use).
type Unchanged struct {
	t    *Table
	seed maphash.Seed
	at   map[uint64]int // key hash: the target row's index
	rows []byte         // the target rows read, as COPY binary fields
	ends []int
	arr  []byte
	keep []int
	fld  []int // scratch: a row's field offsets
}

// NewUnchanged returns a look-up for this target's chunks (LooksUpUnchanged).
func (t *Table) NewUnchanged() *Unchanged {
	return &Unchanged{t: t, seed: maphash.MakeSeed(), at: map[uint64]int{}, fld: make([]int, len(t.cols)+1)}
}

// Keep returns the indexes of the rows, in order, that the target does not
// hold exactly as they are (writer: the chunk's writer, for insert_only).
// Row i is cols[ends[i-1]:ends[i]] (ends[-1] = 0), the row's COPY binary
// fields in the feed's column order. The result is valid until the next
// call.
func (u *Unchanged) Keep(ctx context.Context, tx pgx.Tx, partner string, writer int64, cols []byte, ends []int) ([]int, error) {
	t := u.t
	k0 := t.key0
	// $2: the rows' first key column, a binary array (NULLs left out: such
	// a row is kept)
	n := 0
	arr := appendArrayHeader(u.arr[:0], t.keyOID())
	start := 0
	for _, end := range ends {
		if u.fields(cols[start:end]) {
			f := cols[start:end][u.fld[k0]:u.fld[k0+1]]
			if binary.BigEndian.Uint32(f) != 0xffffffff {
				arr = append(arr, f...)
				n++
			}
		}
		start = end
	}
	setArrayLen(arr, n)
	u.arr = arr
	u.keep = u.keep[:0]
	if n == 0 {
		for i := range ends {
			u.keep = append(u.keep, i)
		}
		return u.keep, nil
	}
	params := [][]byte{[]byte(partner), arr, binary.BigEndian.AppendUint64(nil, uint64(rangeCapFactor*len(ends)))}
	oids := []uint32{oidText, unchangedArray[t.keyOID()], oidInt8}
	formats := []int16{0, 1, 1}
	if t.mode == partners.ModeInsertOnly {
		params = append(params, binary.BigEndian.AppendUint64(nil, uint64(writer)))
		oids = append(oids, oidInt8)
		formats = append(formats, 1)
	}
	// what is kept of the rows read is bounded by the chunk's own bytes
	// (unchangedBytesFactor times), however wide the rows in its range
	limit := unchangedBytesFactor*len(cols) + 64<<10
	read, err := u.read(ctx, tx, t.unchangedRange, params, oids, formats, limit)
	if err == nil && read == rangeCapFactor*len(ends) {
		_, err = u.read(ctx, tx, t.unchangedKeys, params, oids, formats, limit)
	}
	if err != nil {
		return nil, err
	}
	start = 0
	for i, end := range ends {
		row := cols[start:end]
		start = end
		if u.fields(row) {
			if j, ok := u.at[u.keyHash(row)]; ok && bytes.Equal(row, u.row(j)) {
				continue // held as it is: unchanged
			}
		}
		u.keep = append(u.keep, i)
	}
	return u.keep, nil
}

// unchangedBytesFactor bounds the target rows a look-up keeps at this
// many times the bytes of the chunk's own rows.
const unchangedBytesFactor = 2

// read runs a look-up and keeps the rows it returns (in u.rows, u.ends,
// by key in u.at) up to limit bytes, those that may count unchanged; it
// returns how many rows it read.
func (u *Unchanged) read(ctx context.Context, tx pgx.Tx, sql string, params [][]byte, oids []uint32, formats []int16, limit int) (int, error) {
	t := u.t
	want := len(t.cols)
	if t.unchangedOK {
		want++ // may the row count unchanged
	}
	rr := tx.Conn().PgConn().ExecParams(ctx, sql, params, oids, formats, []int16{1})
	clear(u.at)
	u.rows, u.ends = u.rows[:0], u.ends[:0]
	read := 0
	for rr.NextRow() {
		read++
		vals := rr.Values()
		if len(vals) != want {
			rr.Close()
			return 0, fmt.Errorf("unchanged rows: %d columns read, %d expected", len(vals), want)
		}
		if t.unchangedOK {
			if ok := vals[len(t.cols)]; len(ok) != 1 || ok[0] != 1 {
				continue // another intake wrote it (insert_only), a snapshot marked it
			}
			vals = vals[:len(t.cols)]
		}
		if len(u.rows) >= limit {
			continue // read on, keep no more: what is not kept is merged
		}
		rowStart := len(u.rows)
		for _, v := range vals {
			if v == nil {
				u.rows = binary.BigEndian.AppendUint32(u.rows, 0xffffffff)
				continue
			}
			u.rows = binary.BigEndian.AppendUint32(u.rows, uint32(len(v)))
			u.rows = append(u.rows, v...)
		}
		u.ends = append(u.ends, len(u.rows))
		row := u.rows[rowStart:]
		if u.fields(row) {
			u.at[u.keyHash(row)] = len(u.ends) - 1
		}
	}
	if _, err := rr.Close(); err != nil {
		return 0, fmt.Errorf("unchanged rows: %w", err)
	}
	return read, nil
}

// row is target row j as read.
func (u *Unchanged) row(j int) []byte {
	start := 0
	if j > 0 {
		start = u.ends[j-1]
	}
	return u.rows[start:u.ends[j]]
}

// fields sets u.fld to the offsets of row's fields (field i is
// row[fld[i]:fld[i+1]], its length included); false when the row is not
// exactly len(t.cols) fields.
func (u *Unchanged) fields(row []byte) bool {
	at := 0
	for i := range u.t.cols {
		u.fld[i] = at
		if len(row)-at < 4 {
			return false
		}
		l := binary.BigEndian.Uint32(row[at:])
		at += 4
		if l != 0xffffffff {
			if uint64(len(row)-at) < uint64(l) {
				return false
			}
			at += int(l)
		}
	}
	u.fld[len(u.t.cols)] = at
	return at == len(row)
}

// keyHash hashes the key fields of the row whose offsets fields set (a
// collision only compares a row with another key's, which differs).
func (u *Unchanged) keyHash(row []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(u.seed)
	for _, i := range u.t.keyIdx {
		h.Write(row[u.fld[i]:u.fld[i+1]])
	}
	return h.Sum64()
}

// RecordLeftOut records, for a snapshot, the keys of the rows the last
// Keep left out (RecordKeys records those of the rows staged) as applied
// by intakeID, in the chunk's transaction: their key fields are the
// stored ones byte for byte, so the key text is the one the sweep
// computes from the target's rows. cols and ends are the rows Keep got.
func (u *Unchanged) RecordLeftOut(ctx context.Context, tx pgx.Tx, intakeID int64, cols []byte, ends []int) error {
	t := u.t
	if t.unchangedKeysRecord == "" {
		return fmt.Errorf("unchanged rows: %s is not a snapshot's target", t.table)
	}
	order := t.keyOrder
	arrays := make([][]byte, len(order))
	for n, c := range order {
		arrays[n] = appendArrayHeader(nil, t.oids[c])
	}
	kept, start, left := u.keep, 0, 0
	for i, end := range ends {
		row := cols[start:end]
		start = end
		if len(kept) > 0 && kept[0] == i {
			kept = kept[1:]
			continue
		}
		if !u.fields(row) {
			return fmt.Errorf("unchanged rows: row %d is not %d fields", i, len(t.cols))
		}
		for n, c := range order {
			arrays[n] = append(arrays[n], row[u.fld[c]:u.fld[c+1]]...)
		}
		left++
	}
	if left == 0 {
		return nil
	}
	params := [][]byte{binary.BigEndian.AppendUint64(nil, uint64(intakeID))}
	oids := []uint32{oidInt8}
	formats := []int16{1}
	for n, a := range arrays {
		setArrayLen(a, left)
		params = append(params, a)
		oids = append(oids, unchangedArray[t.oids[order[n]]])
		formats = append(formats, 1)
	}
	if _, err := tx.Conn().PgConn().ExecParams(ctx, t.unchangedKeysRecord, params, oids, formats, nil).Close(); err != nil {
		return fmt.Errorf("snapshot keys of unchanged rows: %w", err)
	}
	return nil
}

// appendArrayHeader starts a one-dimensional array of elemOID in the
// binary format (its length set by setArrayLen once the elements, each a
// COPY binary field, are appended): dimensions, a flag that it may hold
// NULLs, the element type, the length, the lower bound.
func appendArrayHeader(dst []byte, elemOID uint32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, 1)
	dst = binary.BigEndian.AppendUint32(dst, 1)
	dst = binary.BigEndian.AppendUint32(dst, elemOID)
	dst = binary.BigEndian.AppendUint32(dst, 0)
	return binary.BigEndian.AppendUint32(dst, 1)
}

// setArrayLen sets the length of the array appendArrayHeader started.
func setArrayLen(a []byte, n int) { binary.BigEndian.PutUint32(a[12:], uint32(n)) }
