package intake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/target"
)

// How a chunk's rows reach the target: one writeRows for a chunk's own
// transaction, a group's and the one held open ahead of the plan; the
// transaction decides how a write the target refuses is recovered from.

// rowTx is the transaction a chunk's rows are written in.
type rowTx int

const (
	// chunkTx: the chunk's own transaction (apply). Its gate sent the
	// savepoint of the rows' path (rowPath) and, for the merge, the
	// staging table. A key that exists sends a direct chunk to the
	// merge; a value the target refuses is searched for under savepoints
	// and its row rejected (refuse.go); a merged chunk whose rows were
	// all new sends the next chunk straight in again.
	chunkTx rowTx = iota
	// groupTx: a group's transaction, its files' rows merged one after
	// the other into the staging table the group made ready
	// (group_commit.go): a refused value, or a key that repeats as the
	// target compares keys, returns, and the file goes on alone.
	groupTx
	// aheadTx: the transaction held open ahead of the plan, which holds
	// many chunks (ahead.go). The direct chunks after the first go into
	// one COPY; only the first has a savepoint to fall back to the merge
	// (one subtransaction at most, not one a chunk); the staging table is
	// truncated between chunks; any other refusal abandons the apply
	// ahead.
	aheadTx
)

// rowWrite is how a run's chunks reach the target in their transaction:
// the transaction's kind, and what a transaction of many chunks (aheadTx)
// carries from one chunk to the next.
type rowWrite struct {
	tx     rowTx
	probed bool // a direct chunk is in: the next refusal abandons
	staged bool // the staging table holds an earlier chunk's rows
	// stream is the COPY open into the target that the direct chunks
	// after the first are written into (nil: none open)
	stream *copyStream
}

// writeRows puts a chunk's valid rows into the target and returns whether
// they went through the staging table (a snapshot records their keys from
// it: rowsWritten). While a file's rows turn out new (r.direct), a chunk
// is COPYed straight into the target under a savepoint (what a bulk load
// costs; the unique index refuses any key that exists). When that is
// refused, or a key repeats within the chunk, the chunk goes through the
// staging table and the guarded merge instead.
func (r *applyStage) writeRows(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, w *rowWrite, writer int64, c *chunkCounts) (staged bool, err error) {
	if w.tx == aheadTx && w.probed && r.direct && !ch.DupKeys && !tgt.StagedDirect() && len(ch.refused) == 0 {
		// into the one COPY (a key that exists fails it, and so abandons)
		if w.stream == nil {
			if w.stream, err = openStream(ctx, tx, tgt); err != nil {
				return false, err
			}
		}
		if err := w.stream.write(ch, r.in.Partner, writer); err != nil {
			return false, err
		}
		c.applied = int64(ch.rows())
		return false, nil
	}
	if err := w.endStream(); err != nil {
		return false, err
	}
	if ch.rows() == 0 {
		return false, nil
	}
	if r.direct && !ch.DupKeys {
		n, ok, err := r.writeDirectOr(ctx, tx, tgt, ch, w, writer)
		if err != nil {
			return false, err
		}
		if ok {
			c.applied = n
			return tgt.StagedDirect(), nil
		}
		if w.tx == chunkTx {
			// the merge's staging table and savepoint, which the gate
			// sent for a chunk that was to go through the merge
			if err := tgt.Stage(ctx, tx); err != nil {
				return false, fmt.Errorf("chunk %d stage: %w", ch.no, err)
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT intake_merge"); err != nil {
				return false, fmt.Errorf("chunk %d savepoint: %w", ch.no, err)
			}
		}
	}
	sub, err := r.toMerge(ctx, tx, tgt, ch, writer)
	if refusedRows(err) != nil && w.tx == chunkTx {
		// a key the server refuses to take (as the staging COPY would):
		// merged whole, so that the search below finds its row
		if err := rollbackTo(ctx, tx, ch, "intake_merge"); err != nil {
			return false, err
		}
		sub, err = ch, nil
	}
	if err != nil {
		return false, err
	}
	var m mergeCounts
	if sub != nil {
		if w.tx == aheadTx {
			if err := w.stage(ctx, tx, tgt); err != nil {
				return false, err
			}
		}
		m, err = r.mergeChunk(ctx, tx, tgt, sub, writer)
	}
	if err == nil && w.tx == groupTx && m.deduped > 0 {
		return false, errKeyRepeated // found by the dedupe alone (target/keys.go): the file reports its rejects alone
	}
	var refused []refusal
	if first := refusedRows(err); first != nil && w.tx == chunkTx {
		// some row's value is refused by the target: find exactly which
		if err := rollbackTo(ctx, tx, ch, "intake_merge"); err != nil {
			return false, err
		}
		m, refused, err = r.refuse(ctx, tx, tgt, sub, writer, first)
		if err == nil {
			err = r.recordRefusals(ctx, tx, refused)
		}
		if err == nil {
			r.log.Warn("rows refused by the target table", "chunk", ch.no, "rows", len(refused),
				"first_line", refused[0].line, "code", refused[0].detail)
		}
	}
	if err != nil {
		return false, err
	}
	if err := r.recordLeftOut(ctx, tx, tgt, ch); err != nil {
		return false, err
	}
	m.into(c)
	c.rejected += int64(len(refused))
	if w.tx == chunkTx {
		r.direct = tgt.Direct() && m.fresh == int64(ch.rows())-c.rejected
	}
	return sub != nil, nil
}

// writeDirectOr writes a chunk straight into the target (writeDirect)
// under the savepoint of its transaction: the gate's in a chunk's own, the
// first direct chunk's own ahead of the plan (released once it is in).
// ok false: some key exists (or a row is otherwise refused), the write
// was rolled back to the savepoint and the file's rows go through the
// merge from here. Without a savepoint, a refusal is the error.
func (r *applyStage) writeDirectOr(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, w *rowWrite, writer int64) (n int64, ok bool, err error) {
	savepoint := w.tx == chunkTx
	staged := w.staged // what the staging table holds at the savepoint
	if w.tx == aheadTx {
		if !w.probed {
			if _, err := tx.Exec(ctx, "SAVEPOINT intake_direct"); err != nil {
				return 0, false, err
			}
			savepoint = true
		}
		if tgt.StagedDirect() {
			if err := w.stage(ctx, tx, tgt); err != nil {
				return 0, false, err
			}
		}
	}
	n, err = r.writeDirect(ctx, tx, tgt, ch, writer)
	if err == nil {
		if w.tx == aheadTx && !w.probed {
			w.probed = true
			// the chunks that follow are written in the transaction
			// itself, not in a subtransaction
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT intake_direct"); err != nil {
				return 0, false, err
			}
		}
		return n, true, nil
	}
	ch.DropPayload()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || !savepoint {
		if ctx.Err() != nil {
			return 0, false, ctx.Err() // a cancelled COPY may surface as a bare closed-connection error
		}
		return 0, false, fmt.Errorf("chunk %d copy: %w", ch.no, err)
	}
	r.direct = false
	if err := rollbackTo(ctx, tx, ch, "intake_direct"); err != nil {
		return 0, false, err
	}
	w.staged = staged
	return 0, false, nil
}

func rollbackTo(ctx context.Context, tx pgx.Tx, ch *chunk, savepoint string) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("chunk %d rollback to savepoint: %w", ch.no, err)
	}
	return nil
}

// stage makes the staging table ready for a chunk in a transaction of
// many chunks: it is emptied at commit only. It is truncated, not deleted
// from: a DELETE leaves its rows dead in the table until the transaction
// ends, and every merge would scan all of them (measured: the 1M-row
// replay took 12.9 s instead of 4.7).
func (w *rowWrite) stage(ctx context.Context, tx pgx.Tx, tgt *target.Table) error {
	if err := tgt.Stage(ctx, tx); err != nil {
		return err
	}
	if w.staged {
		if err := tgt.TruncateStage(ctx, tx); err != nil {
			return err
		}
	}
	w.staged = true
	return nil
}

// copyStream is one COPY straight into the target that chunk after
// chunk is written into: PostgreSQL runs one COPY instead of one a chunk
// (each of which sets up its own bulk insert; measured with psql: 1M rows
// in 100 COPYs took 2.6-2.8 s, in one 2.1-2.3 s).
type copyStream struct {
	pw     *io.PipeWriter
	cancel func() // ends the COPY's statement (close when it failed)
	done   chan error
	n      int64 // rows the COPY wrote, once done
	sent   int64 // rows written into it
	binary bool
	closed bool  // close ran: done was taken
	err    error // close's result
}

// openStream starts the COPY; it runs on tx until close, and no other
// statement may use tx meanwhile. When the COPY ends before it takes its
// header (its context ended), the stream is closed and none is returned.
func openStream(ctx context.Context, tx pgx.Tx, tgt *target.Table) (*copyStream, error) {
	pr, pw := io.Pipe()
	sctx, cancel := context.WithCancel(ctx)
	s := &copyStream{pw: pw, done: make(chan error, 1), binary: tgt.Binary(), cancel: cancel}
	go func() {
		n, err := tgt.CopyDirectFrom(sctx, tx, pr)
		pr.CloseWithError(cmp.Or(err, io.ErrClosedPipe)) // a write waiting on a COPY that ended returns
		s.n = n
		s.done <- err
	}()
	if s.binary {
		if _, err := pw.Write(target.AppendCopyHeader(nil)); err != nil {
			return nil, s.close(false)
		}
	}
	return s, nil
}

// write hands a chunk's rows to the COPY (chunk.streamDirect); it
// returns once the COPY has taken them, so the chunk may be used again.
func (s *copyStream) write(ch *chunk, partner string, writer int64) error {
	if err := ch.StreamDirect(s.pw, partner, writer); err != nil {
		return err
	}
	s.sent += int64(ch.rows())
	return nil
}

// close ends the COPY (ok: with its trailer, else by failing it) and
// returns its error, or an error when it wrote other than the rows sent.
// Closed again, it returns the same.
func (s *copyStream) close(ok bool) error {
	if s.closed {
		return s.err
	}
	s.closed = true
	s.err = s.end(ok)
	return s.err
}

func (s *copyStream) end(ok bool) error {
	if ok && s.binary {
		if _, err := s.pw.Write(target.AppendCopyTrailer(nil)); err != nil {
			ok = false
		}
	}
	if ok {
		s.pw.Close()
	} else {
		s.pw.CloseWithError(errors.New("apply ahead stopped"))
		s.cancel() // not waiting for a COPY stuck on another's lock
	}
	err := <-s.done
	s.cancel()
	if err == nil && !ok {
		err = errors.New("apply ahead stopped")
	}
	if err == nil && s.n != s.sent {
		err = fmt.Errorf("the COPY wrote %d rows, %d were sent", s.n, s.sent)
	}
	return err
}

// endStream closes the open COPY, if any, before another statement.
func (w *rowWrite) endStream() error {
	if w.stream == nil {
		return nil
	}
	err := w.stream.close(true)
	w.stream = nil
	return err
}

// writeDirect writes a chunk of rows that are new so far straight into
// the target: one COPY (carrying each row's hash when the target is
// guarded and intake computes the hash), or when the target is
// StagedDirect (a hash the server computes, a snapshot's keys) COPY into
// the staging table and one INSERT. A key that exists fails either with
// the target's unique violation.
func (r *applyStage) writeDirect(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, writer int64) (int64, error) {
	if !tgt.StagedDirect() {
		return tgt.CopyDirect(ctx, tx, ch.DirectPayload(r.in.Partner, writer))
	}
	if err := tgt.CopyStage(ctx, tx, ch.StagePayload()); err != nil {
		return 0, err
	}
	return tgt.InsertStaged(ctx, tx, writer, r.in.Partner)
}
