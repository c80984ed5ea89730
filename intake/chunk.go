package intake

import (
	"hash/maphash"

	"github.com/partner-intake/partner-intake/intake/chunkrows"
	"github.com/partner-intake/partner-intake/intake/target"
)

// chunk is one chunk of a file's rows: its valid rows and their COPY
// payloads (intake/chunkrows), and what the pipeline knows of it.
type chunk struct {
	chunkrows.Rows
	no          int
	final       bool              // the file's last chunk: its commit moves the file to applied
	first, last int64             // lines the chunk spans, rejected rows included
	refused     []refusal         // rows whose value the column's encoding refused (not among the valid rows)
	heldBack    []int64           // lines of the rows a replay holds back (intake/holdback; not among the valid rows)
	same        *target.Unchanged // the look-up of rows the target holds as they are (toMerge), once needed
	leftOut     bool              // toMerge left rows of this chunk out of its merge
}

func newChunk(seed maphash.Seed, rows int, tgt *target.Table) *chunk {
	return &chunk{Rows: chunkrows.New(seed, rows, tgt)}
}

func (c *chunk) reset(no int) {
	c.no, c.first, c.last, c.final = no, 0, 0, false
	c.refused = c.refused[:0]
	c.heldBack = c.heldBack[:0]
	c.Rows.Reset()
}

// rows is the number of valid rows in the chunk.
func (c *chunk) rows() int { return c.Len() }

// span records a row of the chunk, valid or not.
func (c *chunk) span(line int64) {
	if c.first == 0 {
		c.first = line
	}
	c.last = line
}
