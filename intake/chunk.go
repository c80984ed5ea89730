package intake

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

// chunk is one chunk of a file's rows: the same range of data rows on
// every run (the spooled bytes are immutable), its valid rows encoded once
// as PostgreSQL COPY text (tab-separated, backslash-escaped, \N for NULL).
// The same encoding feeds both ways into the database: straight into the
// target (fresh rows) or into the staging table (merge).
type chunk struct {
	no          int
	final       bool             // the file's last chunk: its commit moves the file to applied
	first, last int64            // lines the chunk spans, rejected rows included
	lines       []int64          // line of each valid row
	ends        []int            // end of each valid row's columns in cols
	cols        []byte           // the valid rows' columns, escaped, no line prefix or newline
	dupKeys     bool             // a key repeats within the chunk (the SQL dedupe must run)
	enc         []target.Encoder // binary COPY: one encoder per column (nil: COPY text)
	// hasher: the target's row hash is intake's (binary only): every row
	// COPYed, straight into the target or into the staging table, carries
	// the hash of its encoded fields (at: their offsets in the row,
	// scratch), computed as the payload is built.
	hasher  *target.RowHasher
	at      []int
	keys    map[uint64]struct{}
	refused []refusal // rows whose value the column's encoding refused (not among the valid rows)
	seed    maphash.Seed
	out     []byte            // payload scratch
	same    *target.Unchanged // the look-up of rows the target holds as they are (toMerge), once needed
	leftOut bool              // toMerge left rows of this chunk out of its merge
}

func newChunk(seed maphash.Seed, rows int, tgt *target.Table) *chunk {
	c := &chunk{keys: make(map[uint64]struct{}, rows), seed: seed, enc: tgt.Encoders(),
		lines: make([]int64, 0, rows), ends: make([]int, 0, rows)}
	if c.enc != nil {
		if c.hasher = tgt.RowHasher(); c.hasher != nil {
			c.at = make([]int, len(c.enc)+1)
		}
	}
	return c
}

func (c *chunk) reset(no int) {
	c.no, c.first, c.last, c.dupKeys, c.final = no, 0, 0, false, false
	c.lines, c.ends, c.cols, c.refused = c.lines[:0], c.ends[:0], c.cols[:0], c.refused[:0]
	clear(c.keys)
}

// chunkCut places a file's rows into chunks, from its first row on: a
// chunk holds at most chunk_rows rows and, unless one row alone is larger,
// at most chunk_bytes bytes of values (valid rows' cells; a rejected row
// carries none into the chunk). It bounds what a chunk buffers whatever
// the rows hold, and depends on the rows alone (see readChunks).
type chunkCut struct {
	no    int
	rows  int
	bytes int64
}

// place returns the chunk the row belongs to, and whether the row opens a
// new chunk after an earlier one.
func (k *chunkCut) place(f *partners.Feed, row *rows.Row) (int, bool) {
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

// rows is the number of valid rows in the chunk.
func (c *chunk) rows() int { return len(c.lines) }

// span records a row of the chunk, valid or not.
func (c *chunk) span(line int64) {
	if c.first == 0 {
		c.first = line
	}
	c.last = line
}

// add appends a valid row. keyIdx are the key columns: a repeated key (by
// hash: a collision only runs the exact SQL dedupe needlessly) marks the
// chunk for the dedupe.
func (c *chunk) add(line int64, vals []string, null []bool, keyIdx []int) error {
	if !c.dupKeys {
		var h maphash.Hash
		h.SetSeed(c.seed)
		for _, k := range keyIdx {
			h.WriteString(vals[k])
			h.WriteByte(0)
		}
		sum := h.Sum64()
		if _, seen := c.keys[sum]; seen {
			c.dupKeys = true
		} else {
			c.keys[sum] = struct{}{}
		}
	}
	if c.enc != nil {
		// binary: each field is its length (-1 for NULL) and its bytes
		start := len(c.cols)
		for i, v := range vals {
			if null[i] {
				c.cols = binary.BigEndian.AppendUint32(c.cols, 0xffffffff)
				continue
			}
			at := len(c.cols)
			c.cols = append(c.cols, 0, 0, 0, 0)
			out, err := c.enc[i](c.cols, v)
			if err != nil {
				c.cols = c.cols[:start] // the row is not added: drop its fields so far
				return &valueError{line: line, col: i, code: err.Error()}
			}
			c.cols = out
			binary.BigEndian.PutUint32(c.cols[at:], uint32(len(c.cols)-at-4))
		}
	} else {
		for i, v := range vals {
			if i > 0 {
				c.cols = append(c.cols, '\t')
			}
			if null[i] {
				c.cols = append(c.cols, `\N`...)
				continue
			}
			c.cols = appendCopyText(c.cols, v)
		}
	}
	c.lines = append(c.lines, line)
	c.ends = append(c.ends, len(c.cols))
	return nil
}

// dropPayload forgets the payload scratch after a failed COPY. pgconn's
// CopyFrom (v5.13) returns on an error receiving from the server (the
// connection died: PostgreSQL restarted, say) without waiting for its
// goroutine that reads the payload, so that goroutine may still read this
// buffer while the retry writes the next payload into it: a fresh buffer
// for the next payload, the old one left to the goroutine.
func (c *chunk) dropPayload() { c.out = nil }

// stagePayload is COPY data for the staging table: line, columns (and
// the row's hash when the chunk has a hasher).
func (c *chunk) stagePayload() []byte {
	out := c.out[:0]
	start := 0
	if c.enc != nil {
		out = target.AppendCopyHeader(out)
		fields := uint16(len(c.enc) + 1)
		if c.hasher != nil {
			fields++
		}
		for i, end := range c.ends {
			out = binary.BigEndian.AppendUint16(out, fields)
			out = binary.BigEndian.AppendUint32(out, 8)
			out = binary.BigEndian.AppendUint64(out, uint64(c.lines[i]))
			out = append(out, c.cols[start:end]...)
			if c.hasher != nil {
				out = binary.BigEndian.AppendUint32(out, 8)
				out = binary.BigEndian.AppendUint64(out, uint64(c.rowHash(c.cols[start:end])))
			}
			start = end
		}
		c.out = target.AppendCopyTrailer(out)
		return c.out
	}
	for i, end := range c.ends {
		out = strconv.AppendInt(out, c.lines[i], 10)
		out = append(out, '\t')
		out = append(out, c.cols[start:end]...)
		out = append(out, '\n')
		start = end
	}
	c.out = out
	return out
}

// directPayload is COPY data for the target: partner_id, columns,
// last_intake_id (and the row's hash when the chunk has a hasher).
func (c *chunk) directPayload(partner string, writer int64) []byte {
	out := c.out[:0]
	if c.enc != nil {
		out = target.AppendCopyHeader(out)
	}
	out = c.appendDirect(out, partner, writer)
	if c.enc != nil {
		out = target.AppendCopyTrailer(out)
	}
	c.out = out
	return out
}

// appendDirect appends the chunk's rows as COPY data for the target,
// without the binary format's header and trailer (a group's files share
// one COPY: each row carries its own file's intake id).
func (c *chunk) appendDirect(out []byte, partner string, writer int64) []byte {
	pre, start := c.directPrefix(partner), 0
	for _, end := range c.ends {
		out = c.appendDirectRow(out, c.cols[start:end], pre, writer)
		start = end
	}
	return out
}

// streamDirect writes the chunk's rows as appendDirect lays them out to
// w, in pieces of about directPiece bytes (c.out is the scratch): what it
// holds at once does not grow with the chunk.
func (c *chunk) streamDirect(w io.Writer, partner string, writer int64) error {
	pre, start := c.directPrefix(partner), 0
	out := c.out[:0]
	for _, end := range c.ends {
		out = c.appendDirectRow(out, c.cols[start:end], pre, writer)
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

// directPiece: the size of the pieces streamDirect writes.
const directPiece = 64 << 10

// directPrefix is what opens every row of the chunk as COPY data for the
// target: the field count and partner_id (binary), or the escaped
// partner_id and its tab (text).
func (c *chunk) directPrefix(partner string) []byte {
	if c.enc == nil {
		return append(appendCopyText(nil, partner), '\t')
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
func (c *chunk) appendDirectRow(out, row, pre []byte, writer int64) []byte {
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
func (c *chunk) rowHash(row []byte) int64 {
	at := 0
	for i := range c.enc {
		c.at[i] = at
		n := int32(binary.BigEndian.Uint32(row[at:]))
		at += 4 + max(int(n), 0)
	}
	c.at[len(c.enc)] = at
	return c.hasher.Sum(row, c.at)
}

// appendCopyText escapes s for COPY's text format: backslash, tab, newline
// and carriage return are the characters it gives meaning to.
func appendCopyText(dst []byte, s string) []byte {
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

// valueError: a column's binary encoder refused a row's value. code says
// why in words that quote no value.
type valueError struct {
	line int64
	col  int
	code string
}

func (e *valueError) Error() string {
	return fmt.Sprintf("line %d, column %d: %s", e.line, e.col+1, e.code)
}
