package intake

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/target"
)

// Rows a chunk on the merge path carries that the target already holds as
// they are are left out of the staging and the merge (target.Unchanged:
// intake compares them itself, on its own core, while PostgreSQL only reads
// the chunk's key range). A replay's chunks then cost one index range scan
// each instead of a COPY and a merge (docs/performance.md).

// unchangedMinRows: a smaller chunk is merged whole (its merge is cheap,
// and a look-up would only add a round trip: a group's small files).
// Tests lower it so that their small files take the look-up.
var unchangedMinRows = 1000

// unchangedPause: after a look-up that found fewer than half of a chunk's
// rows unchanged, this many chunks are merged whole before the next look
// (a file of changed rows pays about one look in this many chunks).
const unchangedPause = 8

// toMerge returns the rows of ch the merge must see: ch itself, or the
// subset the target does not hold as they are, or nil when it holds every
// one (nothing to stage or merge; the chunk's rows count unchanged).
func (r *applyStage) toMerge(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, writer int64) (*chunk, error) {
	ch.leftOut = false
	if ch.rows() < unchangedMinRows || ch.DupKeys || !tgt.LooksUpUnchanged() {
		return ch, nil
	}
	if below, err := r.claimBelow(ctx, tx, tgt, writer); err != nil || below > 0 {
		// every row is merged: the merge claims those found as they are
		return ch, err
	}
	if r.unchangedPause > 0 {
		r.unchangedPause--
		return ch, nil
	}
	if ch.same == nil {
		ch.same = tgt.NewUnchanged()
	}
	keep, err := ch.same.Keep(ctx, tx, r.in.Partner, writer, ch.Cols, ch.Ends)
	if err != nil {
		return nil, fmt.Errorf("chunk %d: %w", ch.no, err)
	}
	r.d.signals.Unchanged.Signal(unchangedLooked{Chunk: ch.no, Rows: ch.rows(), Kept: len(keep)})
	if 2*len(keep) > ch.rows() {
		r.unchangedPause = unchangedPause
	}
	ch.leftOut = len(keep) < ch.rows()
	switch len(keep) {
	case 0:
		return nil, nil
	case ch.rows():
		return ch, nil
	}
	return ch.subset(keep), nil
}

// recordLeftOut records a snapshot's keys of the rows toMerge left out
// (the staged ones are recorded from the staging table): after the merge,
// so that no rollback to the merge's savepoint (a refusal search) undoes
// it.
func (r *applyStage) recordLeftOut(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk) error {
	if !tgt.Snapshot() || !ch.leftOut {
		return nil
	}
	if err := ch.same.RecordLeftOut(ctx, tx, r.in.ID, ch.Cols, ch.Ends); err != nil {
		return fmt.Errorf("chunk %d: %w", ch.no, err)
	}
	return nil
}

// unchangedLooked is a look-up's outcome: of the chunk's rows, how many
// are left to the merge.
type unchangedLooked struct{ Chunk, Rows, Kept int }
