package intake

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// Rows the target refuses (the poison matrix's refused-rows kind, see
// failure.go). A value the feed accepts can still be one the target table
// refuses: a varchar shorter than the feed's max_length, a numeric whose
// precision is smaller, a NOT NULL column for an optional field, a CHECK,
// a foreign key, a second unique index. PostgreSQL refuses the whole
// statement for one such row; here exactly the offending rows are found
// under savepoints and rejected with reason target_refused and their
// SQLSTATE (never the value), and the rest of the chunk applies.

// maxRefusedPerChunk bounds the search: each refused row costs about
// log2(chunk rows) probes of the chunk. A chunk with more refused rows than
// this is a mapping that does not fit its target (intake check says
// which column): the file fails with target_refused instead of probing on.
const maxRefusedPerChunk = 64

// refusal is one row the target refused, in codes.
type refusal struct {
	line   int64
	column string
	detail string // SQLSTATE, condition, constraint: never the value
}

// subset is a chunk of the rows of c at idx (ascending), sharing c's
// encoders and row hasher (used one chunk at a time): what a probe, or the
// final write after the search, sends.
func (c *chunk) subset(idx []int) *chunk {
	s := &chunk{no: c.no, first: c.first, last: c.last, final: c.final, Rows: c.Rows.Subset(idx)}
	return s
}

// mergeCounts is what one merge of staged rows did.
type mergeCounts struct {
	applied, conflict, fresh, deduped int64
	outsideEdit, exists, notFound     int64 // of conflict (outsideEdit, exists) and rejected (notFound)
}

// into sets a chunk's counts from its merge (rejected: the dropped
// repeats and the keys an update_only feed lacks).
func (m mergeCounts) into(c *chunkCounts) {
	c.applied, c.conflict = m.applied, m.conflict
	c.outsideEdit, c.exists, c.notFound = m.outsideEdit, m.exists, m.notFound
	c.rejected = m.deduped + m.notFound
}

// mergeChunk stages ch's rows and merges them: COPY into the staging
// table, the dedupe when a key repeats, the guarded merge.
func (r *applyStage) mergeChunk(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, writer int64) (mergeCounts, error) {
	var m mergeCounts
	if err := tgt.CopyStage(ctx, tx, ch.StagePayload()); err != nil {
		ch.DropPayload()
		if ctx.Err() != nil {
			return m, ctx.Err()
		}
		return m, fmt.Errorf("chunk %d copy: %w", ch.no, err)
	}
	if ch.DupKeys || !tgt.ExactKeys() {
		// (a target that compares keys its own way: only SQL can tell
		// a key repeated, target/keys.go)
		n, err := tgt.Dedupe(ctx, tx, r.in.ID, r.in.Partner)
		if err != nil {
			return m, fmt.Errorf("chunk %d dedupe: %w", ch.no, err)
		}
		m.deduped = n
	}
	below, err := r.claimBelow(ctx, tx, tgt, writer)
	if err != nil {
		return m, fmt.Errorf("chunk %d: %w", ch.no, err)
	}
	merged, err := tgt.Merge(ctx, tx, writer, r.in.Partner, r.in.ID, ch.rows(), below)
	if err != nil {
		return m, fmt.Errorf("chunk %d merge: %w", ch.no, err)
	}
	m.applied, m.conflict, m.fresh = merged.Applied, merged.Conflict, merged.Fresh
	m.outsideEdit, m.exists, m.notFound = merged.OutsideEdit, merged.Exists, merged.NotFound
	return m, nil
}

// probe merges ch under a savepoint and always rolls it back: it only
// asks whether the target takes these rows. A refusal comes back as the
// *pgconn.PgError; any other error is the chunk's own failure.
func (r *applyStage) probe(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, writer int64) (*pgconn.PgError, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT intake_probe"); err != nil {
		return nil, fmt.Errorf("chunk %d probe: %w", ch.no, err)
	}
	_, err := r.mergeChunk(ctx, tx, tgt, ch, writer)
	if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT intake_probe"); rerr != nil {
		return nil, fmt.Errorf("chunk %d probe rollback: %w", ch.no, rerr)
	}
	if err == nil {
		return nil, nil
	}
	if pe := refusedRows(err); pe != nil {
		return pe, nil
	}
	return nil, err
}

// refuse finds the rows of ch the target refuses and merges the others.
// It is called after the chunk's merge failed with first (a class 22/23
// error) and the transaction was rolled back to before the staging COPY.
//
// The search keeps the rows known to be taken (accepted, a prefix of the
// chunk's rows minus the refused ones) and finds, by bisection, the
// shortest next run of rows that the target refuses together with
// accepted: its last row is refused. A refusal that only two rows make
// together (two lines colliding on a second unique index) is found the
// same way: the later row is refused. The merge of the accepted rows then
// runs as usual (dedupe, guarded merge, conflicts), so every row that is
// not refused has the outcome it would have had.
func (r *applyStage) refuse(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, writer int64, first *pgconn.PgError) (mergeCounts, []refusal, error) {
	n := ch.rows()
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	var refused []refusal
	accepted := make([]int, 0, n)
	with := func(pos, end int) *chunk {
		return ch.subset(append(accepted[:len(accepted):len(accepted)], all[pos:end]...))
	}
	pos, known := 0, first // known: the refusal of accepted + rows[pos:n]
	for pos < n {
		if known == nil {
			pe, err := r.probe(ctx, tx, tgt, with(pos, n), writer)
			if err != nil {
				return mergeCounts{}, nil, err
			}
			if pe == nil {
				accepted = append(accepted, all[pos:]...)
				break
			}
			known = pe
		}
		if len(refused) == maxRefusedPerChunk {
			return mergeCounts{}, nil, &FileError{Reason: reason.TargetRefused, Detail: fmt.Sprintf(
				"the target table refused more than %d rows of chunk %d (first at line %d: %s); the feed's columns do not fit the table (run intake check), fix and replay",
				maxRefusedPerChunk, ch.no, refused[0].line, refused[0].detail)}
		}
		// accepted + rows[pos:lo] is taken, accepted + rows[pos:hi] refused
		lo, hi, at := pos, n, known
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			pe, err := r.probe(ctx, tx, tgt, with(pos, mid), writer)
			if err != nil {
				return mergeCounts{}, nil, err
			}
			if pe == nil {
				lo = mid
			} else {
				hi, at = mid, pe
			}
		}
		refused = append(refused, refusal{line: ch.Lines[hi-1], column: refusedColumn(at, tgt.Columns()), detail: pgerr.Codes(at)})
		accepted = append(accepted, all[pos:hi-1]...)
		pos, known = hi, nil
	}
	m, err := r.mergeChunk(ctx, tx, tgt, ch.subset(accepted), writer)
	if refusedRows(err) != nil {
		// the search found a set the target takes; the same set refused now
		// means the target changed under us: fail the chunk, retry it whole
		return m, nil, fmt.Errorf("chunk %d: the target refused rows it took a moment before: %w", ch.no, errRefusalMoved)
	}
	return m, refused, err
}

// errRefusalMoved: a refusal search did not hold (the target changed
// meanwhile); the chunk is retried whole.
var errRefusalMoved = errors.New("refusal moved")

// refusedColumn names the column PostgreSQL blames, when it does: a
// NOT NULL violation names it, a COPY error says "column <name>: <value>"
// in its context, binary COPY "column <name>" (only the name is taken, by
// matching the feed's columns).
func refusedColumn(pe *pgconn.PgError, cols []string) string {
	if pe.ColumnName != "" {
		return pe.ColumnName
	}
	for _, c := range cols {
		i := strings.Index(pe.Where, ", column "+c)
		if i < 0 {
			continue
		}
		// COPY text says "column <name>: <value>", binary "column <name>"
		if rest := pe.Where[i+len(", column "+c):]; rest == "" || rest[0] == ':' || rest[0] == '\n' {
			return c
		}
	}
	return ""
}

// recordRefusals writes the refused rows' issues in one statement.
func (r *applyStage) recordRefusals(ctx context.Context, tx pgx.Tx, refused []refusal) error {
	if len(refused) == 0 {
		return nil
	}
	lines := make([]int64, len(refused))
	cols := make([]string, len(refused))
	details := make([]string, len(refused))
	for i, f := range refused {
		lines[i], cols[i], details[i] = f.line, f.column, f.detail
	}
	return ledger.RecordRefusals(ctx, tx, r.in, reason.TargetRefused, lines, cols, details)
}
