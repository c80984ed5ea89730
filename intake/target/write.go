package target

import (
	"bytes"
	"context"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/partners"
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

// chunkWrites runs a chunk's statements on the pipeline's transaction:
// the staging table, the COPYs, the dedupe, the merge, a snapshot's key
// record and sweep.
type chunkWrites struct{ *tableDef }

// Stage runs StageDDL.
func (t *chunkWrites) Stage(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, t.stageDDL)
	return err
}

// ClearStage empties the staging table within the transaction (a group
// merges its files one after the other).
func (t *chunkWrites) ClearStage(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "DELETE FROM "+t.stage)
	return err
}

// TruncateStage empties the staging table by truncating it, for a
// transaction that stages many chunks one after the other: unlike
// ClearStage it leaves no dead rows for the next merge to scan.
func (t *chunkWrites) TruncateStage(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "TRUNCATE "+t.stage)
	return err
}

// CopyDirect COPYs payload (partner_id, columns, last_intake_id, and the
// row's hash when RowHasher is not nil) straight into the target and
// returns the rows written.
func (t *chunkWrites) CopyDirect(ctx context.Context, tx pgx.Tx, payload []byte) (int64, error) {
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), t.directCopy)
	return tag.RowsAffected(), err
}

// CopyDirectFrom COPYs the rows read from r (as CopyDirect's payload,
// several of them one after the other, the binary format's header once at
// the start and its trailer once at the end) straight into the target.
func (t *chunkWrites) CopyDirectFrom(ctx context.Context, tx pgx.Tx, r io.Reader) (int64, error) {
	tag, err := tx.Conn().PgConn().CopyFrom(ctx, r, t.directCopy)
	return tag.RowsAffected(), err
}

// CopyStage COPYs payload (line, columns) into the staging table.
func (t *chunkWrites) CopyStage(ctx context.Context, tx pgx.Tx, payload []byte) error {
	_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), t.stageCopy)
	return err
}

// Dedupe drops the staged lines whose key a later line repeats, records
// them as rejected row issues of the intake, and returns how many.
func (t *chunkWrites) Dedupe(ctx context.Context, tx pgx.Tx, intakeID int64, partner string) (int64, error) {
	tag, err := tx.Exec(ctx, t.dedupe, intakeID, partner)
	return tag.RowsAffected(), err
}

// Merged is what one merge of staged rows did.
type Merged struct {
	Applied  int64 // rows inserted or updated
	Conflict int64 // rows not written and recorded as conflicts: newer_write, outside_edit, exists
	Fresh    int64 // rows whose key was new to the target
	// of Conflict: rows edited outside intake since it wrote them (kept),
	// and existing keys of an insert_only feed
	OutsideEdit, Exists int64
	// NotFound: keys an update_only feed's target lacks, recorded as
	// rejected row issues
	NotFound int64
	// Claimed: rows found as they are and claimed for the writer (Merge's
	// claimBelow); counted unchanged
	Claimed int64
}

// rangeCapFactor bounds the merge's key-range read at this many target
// rows per staged row; a sparser range is probed row by row instead.
const rangeCapFactor = 4

// Merge merges the staged rows (rows of them) into the target, written and
// judged as writer, for the partner; conflicts are recorded as row issues
// of intakeID. claimBelow > 0 (Claims): an older file of the feed, whose
// place is claimBelow, may still write rows; a row the chunk finds as it
// says, last written by an intake no newer than that, is claimed for
// writer (Merged.Claimed), so that the older file meets it as a newer
// write.
func (t *chunkWrites) Merge(ctx context.Context, tx pgx.Tx, writer int64, partner string, intakeID int64, rows int, claimBelow int64) (Merged, error) {
	var m Merged
	args := []any{writer, partner, intakeID}
	if t.rangeProbe {
		args = append(args, int64(rangeCapFactor*rows))
	}
	if claimBelow > 0 && t.mergeClaim != "" {
		args = append(args, claimBelow)
		err := tx.QueryRow(ctx, t.mergeClaim, args...).Scan(&m.Applied, &m.Conflict, &m.Fresh, &m.OutsideEdit, &m.Exists, &m.NotFound, &m.Claimed)
		return m, err
	}
	err := tx.QueryRow(ctx, t.merge, args...).Scan(&m.Applied, &m.Conflict, &m.Fresh, &m.OutsideEdit, &m.Exists, &m.NotFound)
	return m, err
}

// Claims: the merge can claim rows it finds as they are (Merge's
// claimBelow): an upsert or update_only feed with columns to write.
// Snapshots apply in claim order instead (ledger.SupersededBy), and an
// insert_only feed never overwrites a row.
func (t *Table) Claims() bool { return t.mergeClaim != "" }

// Guarded: the target records a hash of each row intake writes
// (HashColumn): new rows go COPY straight into it only with the hash
// intake computed (RowHasher), else through the staging table (see
// StagedDirect).
func (t *Table) Guarded() bool { return t.guard }

// Mode is the feed's import mode (partners.ModeUpsert, ...).
func (t *Table) Mode() partners.Mode { return t.mode }

// Direct: a chunk whose keys are all new may skip the merge (CopyDirect,
// or InsertStaged when Guarded). Not for an update_only feed, whose new
// keys are rejected.
func (t *Table) Direct() bool { return t.mode != partners.ModeUpdateOnly }

// StagedDirect: a chunk of new rows goes into the staging table and from
// there into the target (InsertStaged), not COPY straight in: the target
// records a hash of each row (Guarded) that the server computes (intake
// computes it only on COPY binary, where RowHasher is not nil; then the
// COPY carries it), or a snapshot records the keys (RecordKeys) from the
// staging table.
func (t *Table) StagedDirect() bool {
	return t.guard && !t.rowHash || t.mode == partners.ModeSnapshot
}

// Snapshot: the feed's files are the partner's complete set (RecordKeys
// per chunk, Sweep in the last).
func (t *Table) Snapshot() bool { return t.mode == partners.ModeSnapshot }

// RecordKeys records the keys of the staged rows as applied by intakeID
// for partner (a snapshot), in the chunk's transaction, after its merge.
func (t *chunkWrites) RecordKeys(ctx context.Context, tx pgx.Tx, intakeID int64, partner string) error {
	args := []any{intakeID}
	if !t.exactKeys {
		args = append(args, partner) // the keys as the target stores them
	}
	_, err := tx.Exec(ctx, t.recordKeys, args...)
	return err
}

// ExactKeys reports whether the target compares keys as intake's
// normalised text of them (keys.go). When it does not, every chunk must be
// deduplicated in SQL (Dedupe): intake cannot tell a key repeated.
func (t *Table) ExactKeys() bool { return t.exactKeys }

// Sweep deletes (or marks in deleted_at) the rows intake wrote for the
// partner and feed, written by writer or older intakes, whose key
// intakeID did not record, and returns how many. The snapshot's last
// transaction runs it; rows edited outside intake stay when the feed keeps
// such edits, and kept says how many stayed so.
func (t *chunkWrites) Sweep(ctx context.Context, tx pgx.Tx, writer int64, partner string, intakeID int64, feed string) (deleted, kept int64, err error) {
	err = tx.QueryRow(ctx, t.sweep, writer, partner, intakeID, feed).Scan(&deleted, &kept)
	return deleted, kept, err
}

// InsertStaged inserts the staged rows into the target as new rows
// written by writer, each with its hash, and returns how many; a key that
// exists fails it with unique_violation, as CopyDirect would.
func (t *chunkWrites) InsertStaged(ctx context.Context, tx pgx.Tx, writer int64, partner string) (int64, error) {
	tag, err := tx.Exec(ctx, t.stageInsert, writer, partner)
	return tag.RowsAffected(), err
}
