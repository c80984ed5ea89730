package target

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The row hash intake computes itself (a guarded target on COPY binary
// whose hashed columns are all sendExact): PostgreSQL's
// hash_record_extended(ROW(record_send(ROW(<hashed columns>))), 0), which
// is hash_bytes_extended (Bob Jenkins' lookup3, 64 bits, seed 0) of the
// record's binary send form: int4 the number of columns, then per column
// int4 its type oid, int4 the length of its send form (-1 for NULL) and
// the send form. From the length on, that is the COPY binary field the
// encoder already wrote, so intake hashes bytes it has; the server
// computes it from the stored values in one record_send and one hash
// (about as cheap as the legacy hash_record_extended over the values).
// hash_bytes_extended reads the bytes as little-endian words on a
// little-endian server; checkRowHash refuses the Go hash (the staged path
// and the legacy hash then) where it does not match, and where the
// session's client_encoding is not UTF8 (textsend converts to it).

// RowHasher returns a hasher of the rows intake encodes for this target
// (one per chunk: it is not safe for concurrent use), or nil when intake
// does not compute the hash (the target is not guarded, or the server
// computes it: COPY text, a column off sendExact).
func (t *Table) RowHasher() *RowHasher {
	if !t.rowHash {
		return nil
	}
	r := &RowHasher{cols: t.hashCols}
	for _, i := range t.hashCols {
		r.oids = append(r.oids, t.oids[i])
	}
	return r
}

// RowHasher computes a row's hash from its COPY binary fields, as
// rowHashSQL does from the stored values.
type RowHasher struct {
	cols []int
	oids []uint32
	buf  []byte
}

// Sum hashes the row whose column i is the COPY binary field
// row[at[i]:at[i+1]].
func (r *RowHasher) Sum(row []byte, at []int) int64 {
	b := binary.BigEndian.AppendUint32(r.buf[:0], uint32(len(r.cols)))
	for n, i := range r.cols {
		b = binary.BigEndian.AppendUint32(b, r.oids[n])
		b = append(b, row[at[i]:at[i+1]]...)
	}
	r.buf = b
	return int64(hashBytesExtended(b, 0))
}

// rowHashSQL is RowHasher's hash recomputed from the values of alias (in
// the target's types).
func (t *tableDef) rowHashSQL(alias string) string {
	var cols []string
	for _, i := range t.hashCols {
		cols = append(cols, alias+"."+pgx.Identifier{t.cols[i]}.Sanitize())
	}
	return fmt.Sprintf("pg_catalog.hash_record_extended(ROW(pg_catalog.record_send(ROW(%s))), 0::int8)", strings.Join(cols, ", "))
}

// rowHashProbe: bytes whose hash checkRowHash compares (every tail length
// of the last 11 bytes is covered by its prefixes).
var rowHashProbe = []byte("\x00\x00\x00\x05\x00\x00\x00\x19\xff\xff\xff\xffintake row hash, é€😀\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\xfe\xfd")

// checkRowHash: the server's hash of bytes is hashBytesExtended's for
// every prefix of rowHashProbe, and the pool's sessions send text as
// UTF-8, so RowHasher's hash is what rowHashSQL computes.
func checkRowHash(ctx context.Context, db *pgxpool.Pool) (bool, error) {
	var enc string
	var got []int64
	err := db.QueryRow(ctx, `SELECT pg_catalog.current_setting('client_encoding'),
		    pg_catalog.array_agg(pg_catalog.hash_record_extended(ROW(pg_catalog.substr($1::bytea, 1::int4, n)), 0::int8) ORDER BY n)
		FROM pg_catalog.generate_series(0::int4, pg_catalog.length($1::bytea)) n`, rowHashProbe).Scan(&enc, &got)
	if err != nil {
		return false, err
	}
	if enc != "UTF8" || len(got) != len(rowHashProbe)+1 {
		return false, nil
	}
	for n, h := range got {
		if uint64(h) != hashBytesExtended(rowHashProbe[:n], 0) {
			return false, nil
		}
	}
	return true, nil
}

// hashBytesExtended is PostgreSQL's hash_bytes_extended
// (src/common/hashfn.c) on a little-endian machine.
func hashBytesExtended(k []byte, seed uint64) uint64 {
	length := uint32(len(k))
	a := 0x9e3779b9 + length + 3923095
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		a, b, c = mix(a, b, c)
		b += uint32(seed)
	}
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k)
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// the last 11 bytes; the lowest byte of c is left out, as there
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	// final(a, b, c)
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return uint64(b)<<32 | uint64(c)
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}
