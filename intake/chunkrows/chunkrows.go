// Package chunkrows holds a chunk's rows as the pipeline writes them:
// where a file's rows are cut into chunks (Cut, by chunk_rows and
// chunk_bytes), a chunk's valid rows encoded once (Rows: PostgreSQL COPY
// text, or COPY binary through the target's encoders, with the row hash
// of the concurrent-edit guard) and the COPY payloads built from them,
// into the staging table or straight into the target. It writes nothing
// to the database: the pipeline (intake) sends the payloads through
// intake/target.
package chunkrows

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"io"
	"strconv"
	"strings"

	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/partners"
)

// Rows are a chunk's valid rows: the same range of data rows on every run
// (the spooled bytes are immutable), encoded once as PostgreSQL COPY text
// (tab-separated, backslash-escaped, \N for NULL) or COPY binary. The
// same encoding feeds both ways into the database: straight into the
// target (fresh rows) or into the staging table (merge).
type Rows struct {
	Lines   []int64 // line of each valid row
	Ends    []int   // end of each valid row's columns in Cols
	Cols    []byte  // the valid rows' columns, escaped, no line prefix or newline
	DupKeys bool    // a key repeats within the chunk (the SQL dedupe must run)
	// Keys are the hashes of the rows' keys (under the chunk's seed), of
	// the rows up to the first repeated key.
	Keys KeySet
	enc  []target.Encoder // binary COPY: one encoder per column (nil: COPY text)
	// hasher: the target's row hash is intake's (binary only): every row
	// COPYed, straight into the target or into the staging table, carries
	// the hash of its encoded fields (at: their offsets in the row,
	// scratch), computed as the payload is built.
	hasher *target.RowHasher
	at     []int
	seed   maphash.Seed
	out    []byte // payload scratch
}

// New is room for rows rows of tgt, their keys hashed under seed.
func New(seed maphash.Seed, rows int, tgt *target.Table) Rows {
	c := Rows{Keys: newKeySet(rows), seed: seed, enc: tgt.Encoders(),
		Lines: make([]int64, 0, rows), Ends: make([]int, 0, rows)}
	if c.enc != nil {
		if c.hasher = tgt.RowHasher(); c.hasher != nil {
			c.at = make([]int, len(c.enc)+1)
		}
	}
	return c
}

// Reset empties c for the next chunk, keeping its room.
func (c *Rows) Reset() {
	c.DupKeys = false
	c.Lines, c.Ends, c.Cols = c.Lines[:0], c.Ends[:0], c.Cols[:0]
	c.Keys.Reset()
}

// Len is the number of valid rows.
func (c *Rows) Len() int { return len(c.Lines) }

// Subset is the rows of c at idx (ascending), sharing c's encoders and row
// hasher (used one chunk at a time).
func (c *Rows) Subset(idx []int) Rows {
	s := Rows{enc: c.enc, DupKeys: c.DupKeys, seed: c.seed, hasher: c.hasher, at: c.at,
		Lines: make([]int64, 0, len(idx)), Ends: make([]int, 0, len(idx))}
	for _, i := range idx {
		start := 0
		if i > 0 {
			start = c.Ends[i-1]
		}
		s.Cols = append(s.Cols, c.Cols[start:c.Ends[i]]...)
		s.Lines = append(s.Lines, c.Lines[i])
		s.Ends = append(s.Ends, len(s.Cols))
	}
	return s
}

// Cut places a file's rows into chunks, from its first row on: a
// chunk holds at most chunk_rows rows and, unless one row alone is larger,
// at most chunk_bytes bytes of values (valid rows' cells; a rejected row
// carries none into the chunk). It bounds what a chunk buffers whatever
// the rows hold, and depends on the rows alone (the pipeline's readChunks).
type Cut struct {
	no    int
	rows  int
	bytes int64
}

// Place returns the chunk the row belongs to, and whether the row opens a
// new chunk after an earlier one.
func (k *Cut) Place(f *partners.Feed, row *rows.Row) (int, bool) {
	var size int64
	if row.Issue == nil {
		for _, v := range row.Values {
			size += int64(len(v))
		}
	}
	next := false
	if k.rows > 0 && (k.rows >= f.ChunkRows || k.bytes+size > f.ChunkBytes) {
		k.no, k.rows, k.bytes, next = k.no+1, 0, 0, true
	}
	k.rows++
	k.bytes += size
	return k.no, next
}

// Add appends a valid row. keyIdx are the key columns: a repeated key (by
// hash: a collision only runs the exact SQL dedupe needlessly) marks the
// chunk for the dedupe.
func (c *Rows) Add(line int64, vals []string, null []bool, keyIdx []int) error {
	if !c.DupKeys {
		var h maphash.Hash
		h.SetSeed(c.seed)
		for _, k := range keyIdx {
			h.WriteString(vals[k])
			h.WriteByte(0)
		}
		c.DupKeys = c.Keys.Add(h.Sum64())
	}
	if c.enc != nil {
		// binary: each field is its length (-1 for NULL) and its bytes
		start := len(c.Cols)
		for i, v := range vals {
			if null[i] {
				c.Cols = binary.BigEndian.AppendUint32(c.Cols, 0xffffffff)
				continue
			}
			at := len(c.Cols)
			c.Cols = append(c.Cols, 0, 0, 0, 0)
			out, err := c.enc[i](c.Cols, v)
			if err != nil {
				c.Cols = c.Cols[:start] // the row is not added: drop its fields so far
				return &ValueError{Line: line, Col: i, Code: err.Error()}
			}
			c.Cols = out
			binary.BigEndian.PutUint32(c.Cols[at:], uint32(len(c.Cols)-at-4))
		}
	} else {
		for i, v := range vals {
			if i > 0 {
				c.Cols = append(c.Cols, '\t')
			}
			if null[i] {
				c.Cols = append(c.Cols, `\N`...)
				continue
			}
			c.Cols = AppendText(c.Cols, v)
		}
	}
	c.Lines = append(c.Lines, line)
	c.Ends = append(c.Ends, len(c.Cols))
	return nil
}

// DropPayload forgets the payload scratch after a failed COPY. pgconn's
// CopyFrom (v5.13) returns on an error receiving from the server (the
// connection died: PostgreSQL restarted, say) without waiting for its
// goroutine that reads the payload, so that goroutine may still read this
// buffer while the retry writes the next payload into it: a fresh buffer
// for the next payload, the old one left to the goroutine.
func (c *Rows) DropPayload() { c.out = nil }

// StagePayload is COPY data for the staging table: line, columns (and
// the row's hash when the chunk has a hasher).
func (c *Rows) StagePayload() []byte {
	out := c.out[:0]
	start := 0
	if c.enc != nil {
		out = target.AppendCopyHeader(out)
		fields := uint16(len(c.enc) + 1)
		if c.hasher != nil {
			fields++
		}
		for i, end := range c.Ends {
			out = binary.BigEndian.AppendUint16(out, fields)
			out = binary.BigEndian.AppendUint32(out, 8)
			out = binary.BigEndian.AppendUint64(out, uint64(c.Lines[i]))
			out = append(out, c.Cols[start:end]...)
			if c.hasher != nil {
				out = binary.BigEndian.AppendUint32(out, 8)
				out = binary.BigEndian.AppendUint64(out, uint64(c.rowHash(c.Cols[start:end])))
			}
			start = end
		}
		c.out = target.AppendCopyTrailer(out)
		return c.out
	}
	for i, end := range c.Ends {
		out = strconv.AppendInt(out, c.Lines[i], 10)
		out = append(out, '\t')
		out = append(out, c.Cols[start:end]...)
		out = append(out, '\n')
		start = end
	}
	c.out = out
	return out
}

// DirectPayload is COPY data for the target: partner_id, columns,
// last_intake_id (and the row's hash when the chunk has a hasher).
func (c *Rows) DirectPayload(partner string, writer int64) []byte {
	out := c.out[:0]
	if c.enc != nil {
		out = target.AppendCopyHeader(out)
	}
	out = c.AppendDirect(out, partner, writer)
	if c.enc != nil {
		out = target.AppendCopyTrailer(out)
	}
	c.out = out
	return out
}

// AppendDirect appends the chunk's rows as COPY data for the target,
// without the binary format's header and trailer (a group's files share
// one COPY: each row carries its own file's intake id).
func (c *Rows) AppendDirect(out []byte, partner string, writer int64) []byte {
	pre, start := c.directPrefix(partner), 0
	for _, end := range c.Ends {
		out = c.appendDirectRow(out, c.Cols[start:end], pre, writer)
		start = end
	}
	return out
}

// StreamDirect writes the chunk's rows as AppendDirect lays them out to
// w, in pieces of about directPiece bytes (c.out is the scratch): what it
// holds at once does not grow with the chunk.
func (c *Rows) StreamDirect(w io.Writer, partner string, writer int64) error {
	pre, start := c.directPrefix(partner), 0
	out := c.out[:0]
	for _, end := range c.Ends {
		out = c.appendDirectRow(out, c.Cols[start:end], pre, writer)
		start = end
		if len(out) >= directPiece {
			if _, err := w.Write(out); err != nil {
				return err
			}
			out = out[:0]
		}
	}
	c.out = out
	if len(out) > 0 {
		_, err := w.Write(out)
		return err
	}
	return nil
}

// directPiece: the size of the pieces StreamDirect writes.
const directPiece = 64 << 10

// directPrefix is what opens every row of the chunk as COPY data for the
// target: the field count and partner_id (binary), or the escaped
// partner_id and its tab (text).
func (c *Rows) directPrefix(partner string) []byte {
	if c.enc == nil {
		return append(AppendText(nil, partner), '\t')
	}
	fields := uint16(len(c.enc) + 2)
	if c.hasher != nil {
		fields++
	}
	pre := binary.BigEndian.AppendUint16(nil, fields)
	pre = binary.BigEndian.AppendUint32(pre, uint32(len(partner)))
	return append(pre, partner...)
}

// appendDirectRow appends one row (its encoded columns) as COPY data for
// the target: pre (directPrefix), the columns, last_intake_id (and the
// row's hash when the chunk has a hasher).
func (c *Rows) appendDirectRow(out, row, pre []byte, writer int64) []byte {
	out = append(out, pre...)
	out = append(out, row...)
	if c.enc == nil {
		out = append(out, '\t')
		out = strconv.AppendInt(out, writer, 10)
		return append(out, '\n')
	}
	out = binary.BigEndian.AppendUint32(out, 8)
	out = binary.BigEndian.AppendUint64(out, uint64(writer))
	if c.hasher != nil {
		out = binary.BigEndian.AppendUint32(out, 8)
		out = binary.BigEndian.AppendUint64(out, uint64(c.rowHash(row)))
	}
	return out
}

// rowHash is the hash of a row of binary fields (each an int4 length, -1
// for NULL, and that many bytes), as the target's RowHasher takes it.
func (c *Rows) rowHash(row []byte) int64 {
	at := 0
	for i := range c.enc {
		c.at[i] = at
		n := int32(binary.BigEndian.Uint32(row[at:]))
		at += 4 + max(int(n), 0)
	}
	c.at[len(c.enc)] = at
	return c.hasher.Sum(row, c.at)
}

// AppendText escapes s for COPY's text format: backslash, tab, newline
// and carriage return are the characters it gives meaning to.
func AppendText(dst []byte, s string) []byte {
	if !needsCopyEscape(s) {
		return append(dst, s...)
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; b {
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, b)
		}
	}
	return dst
}

func needsCopyEscape(s string) bool {
	return strings.ContainsAny(s, "\\\t\n\r")
}

// ValueError: a column's binary encoder refused a row's value. code says
// why in words that quote no value.
type ValueError struct {
	Line int64
	Col  int
	Code string
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("line %d, column %d: %s", e.Line, e.Col+1, e.Code)
}
