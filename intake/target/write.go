package target

import (
	"bytes"
	"context"

	"github.com/jackc/pgx/v5"
)

// What the pipeline runs on a target, each on the transaction of its chunk
// or group: rows go COPY straight into the target while they are all new
// (CopyDirect), else into the staging table (Stage, CopyStage), through the
// dedupe when a key repeats (Dedupe) and the guarded merge (Merge). The
// pipeline decides the path, the savepoints and the retries; the SQL is
// built here once per mapping (build).

// Encoders are the chunk encoders: one per column for COPY binary, or
// nil for COPY text.
func (t *Table) Encoders() []Encoder {
	if t.binary {
		return t.enc
	}
	return nil
}

// Binary: rows travel in COPY's binary format, so a payload opens with
// AppendCopyHeader and ends with AppendCopyTrailer.
func (t *Table) Binary() bool { return t.binary }

// Columns are the feed's columns in file order, as every COPY names them.
func (t *Table) Columns() []string { return t.cols }

// StageDDL creates the staging table on the connection unless it has it
// (it is kept, and emptied at each commit); for a batch that sends it with
// other statements.
func (t *Table) StageDDL() string { return t.stageDDL }

// Stage runs StageDDL.
func (t *Table) Stage(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, t.stageDDL)
	return err
}

// ClearStage empties the staging table within the transaction (a group
// merges its files one after the other).
func (t *Table) ClearStage(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "DELETE FROM "+t.stage)
	return err
}

// CopyDirect COPYs payload (partner_id, columns, last_intake_id) straight
// into the target and returns the rows written.
func (t *Table) CopyDirect(ctx context.Context, tx pgx.Tx, payload []byte) (int64, error) {
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), t.directCopy)
	return tag.RowsAffected(), err
}

// CopyStage COPYs payload (line, columns) into the staging table.
func (t *Table) CopyStage(ctx context.Context, tx pgx.Tx, payload []byte) error {
	_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), t.stageCopy)
	return err
}

// Dedupe drops the staged lines whose key a later line repeats, records
// them as rejected row issues of the intake, and returns how many.
func (t *Table) Dedupe(ctx context.Context, tx pgx.Tx, intakeID int64, partner string) (int64, error) {
	tag, err := tx.Exec(ctx, t.dedupe, intakeID, partner)
	return tag.RowsAffected(), err
}

// Merged is what one merge of staged rows did.
type Merged struct {
	Applied  int64 // rows inserted or updated
	Conflict int64 // rows a newer intake holds: recorded as conflicts
	Fresh    int64 // rows whose key was new to the target
}

// rangeCapFactor bounds the merge's key-range read at this many target
// rows per staged row; a sparser range is probed row by row instead.
const rangeCapFactor = 4

// Merge merges the staged rows (rows of them) into the target, written and
// judged as writer, for the partner; conflicts are recorded as row issues
// of intakeID.
func (t *Table) Merge(ctx context.Context, tx pgx.Tx, writer int64, partner string, intakeID int64, rows int) (Merged, error) {
	var m Merged
	args := []any{writer, partner, intakeID}
	if t.rangeProbe {
		args = append(args, int64(rangeCapFactor*rows))
	}
	err := tx.QueryRow(ctx, t.merge, args...).Scan(&m.Applied, &m.Conflict, &m.Fresh)
	return m, err
}
