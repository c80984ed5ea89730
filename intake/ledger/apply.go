package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
)

// The statements of plan and apply. A file's plan, its chunks' ledger
// rows and its progress commit in the same transaction as what they
// describe (the rejected rows, the chunk's target rows): these take the
// pipeline's pgx.Tx or are queued onto its *pgx.Batch.

// Querier is a pool or a transaction.
type Querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Plan moves a spooled file on to next (applying, or spooled again when
// it is held) with its totals and the hash of the feed configuration that
// planned it (feedSHA), and clears an earlier plan's rows, in one fenced
// statement; with no rejected rows it is the whole plan step.
func Plan(ctx context.Context, q Querier, in *Intake, next State, total, rejected int64, feedSHA string) error {
	var moved int64
	err := q.QueryRow(ctx, `WITH g AS (
		    UPDATE file_intake SET state = $3, rows_total = $4, rows_rejected = $5, feed_sha256 = $6, updated_at = pg_catalog.now()
		    WHERE intake_id = $1 AND fencing_token = $2 AND state = 'spooled' RETURNING 1),
		d AS (DELETE FROM intake_row_issue WHERE intake_id = $1 AND EXISTS (SELECT 1 FROM g))
		SELECT pg_catalog.count(*) FROM g`,
		in.ID, in.Token, string(next), total, rejected, feedSHA).Scan(&moved)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if moved == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "plan"}
	}
	in.FeedSHA256 = feedSHA
	return nil
}

// Replan moves a file planned under another feed configuration, none of
// whose chunks is applied, back to spooled (applying -> spooled, fenced,
// only while chunks_done = 0) so that it is planned again under the
// configuration in force.
func Replan(ctx context.Context, q Querier, in *Intake) error {
	var moved int64
	err := q.QueryRow(ctx, `WITH g AS (
		    UPDATE file_intake SET state = 'spooled', feed_sha256 = NULL, updated_at = pg_catalog.now()
		    WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applying' AND chunks_done = 0 RETURNING 1)
		SELECT pg_catalog.count(*) FROM g`, in.ID, in.Token).Scan(&moved)
	if err != nil {
		return fmt.Errorf("replan: %w", err)
	}
	if moved == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "replan"}
	}
	in.State, in.FeedSHA256 = StateSpooled, ""
	return nil
}

var issueCols = []string{"intake_id", "partner_id", "line", "column_name", "reason", "outcome"}

// RejectedRowValues is one rejected row's values for CopyRejectedRows.
func RejectedRowValues(in *Intake, line int64, column string, why reason.Code) []any {
	var col any
	if column != "" {
		col = column
	}
	return []any{in.ID, in.Partner, line, col, string(why), IssueRejected}
}

// CopyRejectedRows writes a plan's rejected rows (RejectedRowValues) in
// the plan's transaction.
func CopyRejectedRows(ctx context.Context, tx pgx.Tx, src pgx.CopyFromSource) (int64, error) {
	return tx.CopyFrom(ctx, pgx.Identifier{"intake_row_issue"}, issueCols, src)
}

// RecordRefusals writes the rows the target refused in a chunk, in the
// chunk's transaction, in one statement.
func RecordRefusals(ctx context.Context, tx pgx.Tx, in *Intake, why reason.Code, lines []int64, cols, details []string) error {
	_, err := tx.Exec(ctx, `INSERT INTO intake_row_issue (intake_id, partner_id, line, column_name, reason, outcome, detail)
		SELECT $1, $2, l, nullif(c, ''), $3, 'rejected', d FROM unnest($4::bigint[], $5::text[], $6::text[]) AS u(l, c, d)`,
		in.ID, in.Partner, why, lines, cols, details)
	if err != nil {
		return fmt.Errorf("record refused rows: %w", err)
	}
	return nil
}

// RecordConflicts records rows of the intake held back in conflict for
// why, each with the detail.
func RecordConflicts(ctx context.Context, tx pgx.Tx, in *Intake, why reason.Code, lines []int64, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome, detail)
		SELECT $1, $2, l, $3, 'conflict', $5 FROM unnest($4::bigint[]) AS u(l)`,
		in.ID, in.Partner, why, lines, detail)
	if err != nil {
		return fmt.Errorf("record rows in conflict: %w", err)
	}
	return nil
}

// chunkStore records a file's apply in intake_chunk and file_intake: the
// chunk gate, the chunks committed, the attempts and deferrals.
type chunkStore struct{ *core }

// QueueChunkGate queues a chunk's gate as the first statement of the
// chunk's first batch: the row lock it takes also blocks a takeover until
// the transaction ends, and the token check fences a stale owner. No row
// affected means the gate is closed (ChunkGateClosed says why).
func (l *chunkStore) QueueChunkGate(b *pgx.Batch, in *Intake, chunk int) {
	b.Queue(`UPDATE file_intake SET lease_until = pg_catalog.now() + $4::interval, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = 'applying' AND chunks_done = $3`,
		in.ID, in.Token, chunk, l.lease)
}

// SupersededBy returns the newest intake of the partner's feed that
// applies a newer snapshot than the bytes of intake writer (a snapshot's
// place is its claim order: the intake whose bytes it applies, for a
// replay the file replayed) and has committed rows or is applied; 0 when
// there is none. Called in a chunk's transaction, it first takes the
// feed's snapshot lock, held to the commit: no newer snapshot commits a
// chunk between this look and the caller's, so of two snapshots of a feed
// the older never commits a row after the newer has begun. The lock must
// be taken outside any savepoint (lock false, after QueueSnapshotLock,
// when the caller's transaction has one open): PostgreSQL releases a lock
// taken inside a savepoint when the transaction rolls back to it, and a
// chunk rolls back to its savepoint whenever a key exists or a row is
// refused.
func SupersededBy(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, partner, feed string, writer int64, lock bool) (int64, error) {
	if lock {
		if err := q.QueryRow(ctx, snapshotLockSQL, partner, feed).Scan(new(int)); err != nil {
			return 0, fmt.Errorf("snapshot lock: %w", err)
		}
	}
	var newer int64
	err := q.QueryRow(ctx, `SELECT coalesce(pg_catalog.max(n.intake_id), 0) FROM file_intake n
		WHERE `+newerSnapshotOf("$1", "$2", "$3"), partner, feed, writer).Scan(&newer)
	if err != nil {
		return 0, fmt.Errorf("newer snapshot: %w", err)
	}
	return newer, nil
}

// snapshotLockSQL takes the partner's feed's snapshot lock until the
// transaction ends.
const snapshotLockSQL = `SELECT 1 FROM (SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(
	'partner-intake/snapshot/'::text || $1::text || '/'::text || $2::text, 0::int8))) AS locked`

// QueueSnapshotLock queues the statement that takes the partner's feed's
// snapshot lock (SupersededBy) on b, for a batch that opens a savepoint
// after it.
func QueueSnapshotLock(b *pgx.Batch, partner, feed string) {
	b.Queue(snapshotLockSQL, partner, feed)
}

// newerSnapshotOf is the condition on a file_intake row n of being a newer
// snapshot of the partner's feed than place (the intake whose bytes a
// snapshot applies) that holds rows: committed chunks, or applied; SQL
// expressions for the three.
func newerSnapshotOf(partner, feed, place string) string {
	return `n.partner_id = ` + partner + ` AND n.feed = ` + feed + ` AND coalesce(n.replay_of, n.intake_id) > ` + place + `
		  AND (n.chunks_done > 0 OR n.state IN ('applied', 'archived')) AND n.reason IS DISTINCT FROM 'superseded'`
}

// OlderWriter returns the place (the intake whose bytes it applies) of
// the newest file of the partner's feeds (those writing one table,
// partners.Config.FeedsOn) older than place that may still write rows: one not yet applied (claimed, spooled, applying, awaiting
// approval, outcome unknown) or held for ops, who may release or replay
// it (quarantined, failed for good; not one held for a reason that can
// only be discarded, DiscardOnly); 0 when there is none. A file applied
// in full can still be replayed: its replay writes its values again,
// which every newer file that found them as they are also says, unless
// the row was edited outside intake since on a target that does not keep
// such edits (docs/failure-matrix.md, not covered); a row the file did
// not write the first time (it was rejected) its replay holds back when a
// newer file named its key (intake/holdback).
func OlderWriter(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, partner string, feeds []string, place int64) (int64, error) {
	var older int64
	err := q.QueryRow(ctx, `SELECT coalesce(pg_catalog.max(coalesce(replay_of, intake_id)), 0) FROM file_intake
		WHERE partner_id = $1 AND feed = ANY($2::text[]) AND coalesce(replay_of, intake_id) < $3
		  AND (state IN ('claimed', 'spooled', 'applying', 'awaiting_approval', 'outcome_unknown')
		    OR state IN ('quarantined', 'failed_terminal') AND reason <> ALL($4::text[]))`,
		partner, feeds, place, DiscardOnly).Scan(&older)
	if err != nil {
		return 0, fmt.Errorf("older writer: %w", err)
	}
	return older, nil
}

// RejectedLines are the lines of a file's rows its own run rejected
// (the mapping, the row checks, the target); unless dup, not those of a
// key repeated within a chunk, whose key the later line wrote.
// complete is false when the file recorded more rejected rows than are
// left (retention.row_issues purged them): which lines they were is not
// known.
func RejectedLines(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, intakeID int64, dup bool) (lines []int64, complete bool, err error) {
	but := string(reason.DuplicateKey)
	if dup {
		but = ""
	}
	// one statement, one snapshot: a purge of the issues between two
	// looks would make the lines seem complete and none
	var recorded, left int64
	err = q.QueryRow(ctx, `SELECT f.rows_rejected,
		  (SELECT pg_catalog.count(*) FROM intake_row_issue i WHERE i.intake_id = f.intake_id AND i.outcome = 'rejected'),
		  coalesce((SELECT pg_catalog.array_agg(DISTINCT i.line ORDER BY i.line) FROM intake_row_issue i
		    WHERE i.intake_id = f.intake_id AND i.outcome = 'rejected' AND i.reason <> $2), '{}')
		FROM file_intake f WHERE f.intake_id = $1`, intakeID, but).Scan(&recorded, &left, &lines)
	if err != nil {
		return nil, false, fmt.Errorf("rejected lines: %w", err)
	}
	return lines, left >= recorded, nil
}

// NewerFile is a file of a table newer than a replay's place that may
// have named a key the replayed file did not write: its feed and the
// bytes its rows come from.
type NewerFile struct {
	ID         int64
	Feed       string
	DataSHA256 string
	DataSize   int64
	// the file as delivered, when its rows come from its expanded or
	// decrypted copy (dropped from the spool once the file finished)
	RemoteName string
	SHA256     string
	Size       int64
	// ArchivePath is where its bytes are kept on the site ("": nowhere)
	ArchivePath string
}

// NewerOnTable lists the files of the partner's feeds (those writing one
// table), and of any feed not configured now (gone: what it wrote is not
// known), newer than place (the intake whose bytes a replay applies) that
// hold rows or may have judged rows already: archived, any with
// committed chunks, and every live one (an apply ahead judges rows while
// its file downloads, and one that began before the replay's row existed
// did not count it an older writer); not a duplicate (its bytes came
// with another intake), a superseded snapshot, or self. A file whose
// bytes are not known yet has DataSHA256 "". Files that apply the same
// bytes (a newer replay and its original) are listed once.
func NewerOnTable(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, partner string, feeds, configured []string, place, self int64) ([]NewerFile, error) {
	rs, err := q.Query(ctx, `SELECT DISTINCT ON (coalesce(data_sha256, content_sha256, intake_id::text))
		  intake_id, feed, coalesce(data_sha256, content_sha256, ''), coalesce(data_size, size_bytes, 0),
		  remote_name, coalesce(content_sha256, ''), coalesce(size_bytes, 0), coalesce(archive_path, '') FROM file_intake
		WHERE partner_id = $1 AND (feed = ANY($2::text[]) OR feed <> ALL($6::text[])) AND coalesce(replay_of, intake_id) > $3 AND intake_id <> $4
		  AND (state = 'archived' OR chunks_done > 0 OR state = ANY($5))
		  AND reason IS DISTINCT FROM 'superseded'
		ORDER BY coalesce(data_sha256, content_sha256, intake_id::text), intake_id`, partner, feeds, place, self, liveStates, configured)
	if err != nil {
		return nil, fmt.Errorf("newer files: %w", err)
	}
	files, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (NewerFile, error) {
		var f NewerFile
		err := row.Scan(&f.ID, &f.Feed, &f.DataSHA256, &f.DataSize, &f.RemoteName, &f.SHA256, &f.Size, &f.ArchivePath)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("newer files: %w", err)
	}
	return files, nil
}

// DiscardOnly are the reasons a held file can only be discarded for
// (ops.Release refuses it): its rows are never applied.
var DiscardOnly = []string{string(reason.NotRegularFile), string(reason.BadBatchID), string(reason.ChangedAfterClaim)}

// RejectedBut counts the intake's rejected rows recorded as row issues
// (its chunks committed so far, and the one of tx) for any reason but
// but.
func RejectedBut(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, intakeID int64, but reason.Code) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM intake_row_issue
		WHERE intake_id = $1 AND outcome = 'rejected' AND reason <> $2`, intakeID, string(but)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("rejected rows: %w", err)
	}
	return n, nil
}

// ErrChunkDone: the ledger already holds this chunk under our token.
var ErrChunkDone = errors.New("chunk already committed")

// LedgerBehindError: the ledger holds fewer chunks than this worker saw
// commit. Only a database crash does that (chunks before a file's last
// commit without waiting for the WAL flush, and the crash lost the
// newest). Nothing is guessed: the run stops, and the file resumes from
// what the ledger holds on the next poll.
type LedgerBehindError struct {
	IntakeID int64
	Chunk    int
	Done     int
}

func (e *LedgerBehindError) Error() string {
	return fmt.Sprintf("intake %d: the ledger holds %d chunks, chunk %d was next (the database lost its newest commits in a crash); resuming from the ledger",
		e.IntakeID, e.Done, e.Chunk)
}

// ChunkGateClosed explains a gate that let nothing through: fenced out,
// or the chunk is already in the ledger (a commit whose reply was lost).
// q is the gate's transaction, or the pool when that transaction may have
// been aborted since.
func ChunkGateClosed(ctx context.Context, q Querier, in *Intake, chunk int) error {
	var token int64
	var state string
	var done int
	err := q.QueryRow(ctx, `SELECT fencing_token, state, chunks_done FROM file_intake WHERE intake_id = $1`, in.ID).
		Scan(&token, &state, &done)
	if err != nil {
		return fmt.Errorf("chunk %d: read ledger: %w", chunk, err)
	}
	if token == in.Token && state == string(StateApplying) && done > chunk {
		return ErrChunkDone
	}
	if token == in.Token && state == string(StateApplying) && done < chunk {
		return &LedgerBehindError{IntakeID: in.ID, Chunk: chunk, Done: done}
	}
	return &FencedError{IntakeID: in.ID, Token: in.Token, Step: fmt.Sprintf("chunk %d", chunk)}
}

// Chunk is what a chunk's transaction did: its lines and row outcomes.
type Chunk struct {
	No                                     int
	First, Last                            int64
	Applied, Unchanged, Rejected, Conflict int64
	// Deleted: rows a snapshot's last chunk deleted or marked (not rows
	// of the file: outside the totals).
	Deleted int64
	// DeleteKept: rows the last chunk's sweep kept, edited outside intake
	// (outside the totals).
	DeleteKept int64
	// Final: the file's last chunk.
	Final bool
}

// ChunkDone writes the chunk's ledger row and the file's progress in the
// chunk's transaction, in one round trip; the last chunk also moves the
// file to applied when its totals reconcile (fileApplied).
func (l *chunkStore) ChunkDone(ctx context.Context, tx pgx.Tx, in *Intake, c Chunk) (fileApplied bool, err error) {
	b := &pgx.Batch{}
	l.queueChunkDone(b, in, c)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return false, fmt.Errorf("chunk %d ledger: %w", c.No, err)
	}
	var state string
	err = br.QueryRow().Scan(&state)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return false, &FencedError{IntakeID: in.ID, Token: in.Token, Step: fmt.Sprintf("chunk %d progress", c.No)}
	}
	if err != nil {
		return false, fmt.Errorf("chunk %d progress: %w", c.No, err)
	}
	return state == string(StateApplied), nil
}

// queueChunkDone queues a chunk's ledger row and the file's progress (the
// second returns the file's state, or no row when fenced).
func (l *chunkStore) queueChunkDone(b *pgx.Batch, in *Intake, c Chunk) {
	b.Queue(`INSERT INTO intake_chunk (intake_id, chunk_no, partner_id, first_line, last_line,
		rows_applied, rows_unchanged, rows_conflict, fencing_token) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		in.ID, c.No, in.Partner, c.First, c.Last, c.Applied, c.Unchanged, c.Conflict, in.Token)
	b.Queue(`UPDATE file_intake SET rows_applied = rows_applied + $4, rows_unchanged = rows_unchanged + $5,
		rows_rejected = rows_rejected + $6, rows_conflict = rows_conflict + $7, chunks_done = $3 + 1,
		rows_deleted = rows_deleted + $10, rows_delete_kept = rows_delete_kept + $11, lease_until = pg_catalog.clock_timestamp() + $9::interval,
		state = CASE WHEN $8::boolean AND rows_applied + $4 + rows_unchanged + $5 + rows_rejected + $6 + rows_conflict + $7 = rows_total
		             THEN 'applied' ELSE state END, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND chunks_done = $3
		RETURNING state`,
		in.ID, in.Token, c.No, c.Applied, c.Unchanged, c.Rejected, c.Conflict, c.Final, l.lease, c.Deleted, c.DeleteKept)
}

// ChunksDone writes the ledger rows of chunks applied ahead of the plan
// (none of them the file's last) and the file's progress, behind the first
// chunk's gate, all in one round trip on the transaction that holds their
// rows: the gate passes only while the file is applying under in's token
// with no chunk done, so a file the plan held, or another worker took
// over, gets none of it (the caller rolls back; a FencedError).
func (l *chunkStore) ChunksDone(ctx context.Context, tx pgx.Tx, in *Intake, cs []Chunk) error {
	b := &pgx.Batch{}
	l.QueueChunkGate(b, in, 0)
	for _, c := range cs {
		l.queueChunkDone(b, in, c)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("chunks applied ahead: gate: %w", err)
	}
	if tag.RowsAffected() == 0 {
		// the chunk rows sent behind the gate may have failed on another
		// worker's and aborted tx: the reason is read outside it
		br.Close()
		return ChunkGateClosed(ctx, l.pool, in, 0)
	}
	for _, c := range cs {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("chunk %d ledger: %w", c.No, err)
		}
		var state string
		if err := br.QueryRow().Scan(&state); errors.Is(err, pgx.ErrNoRows) {
			return &FencedError{IntakeID: in.ID, Token: in.Token, Step: fmt.Sprintf("chunk %d progress", c.No)}
		} else if err != nil {
			return fmt.Errorf("chunk %d progress: %w", c.No, err)
		}
	}
	return br.Close()
}

// attemptSet counts an attempt of the file ($3 = base, $4 = max backoff,
// $5 = the last error): RecordAttempt's failed run and MarkUnknown's
// commit without answer alike, so the retry budget bounds both.
const attemptSet = `attempts = attempts + 1,
		    first_failed_at = coalesce(first_failed_at, pg_catalog.now()),
		    next_attempt_at = pg_catalog.now() + CASE WHEN attempts = 0 THEN interval '0'
		        ELSE least($3::interval * pg_catalog.power(2::float8, (attempts - 1)::float8), $4::interval) * (0.75 + pg_catalog.random() / 2) END,
		    last_error = $5, updated_at = pg_catalog.now()`

// RecordAttempt counts a failed run of the file and sets its next attempt,
// under the file's fencing token: the first failure is tried again on the
// next poll (a one-off, as most are), later ones after base doubling per
// attempt, capped at max, with jitter. It returns the attempts so far and
// how long ago the first failed.
func (l *chunkStore) RecordAttempt(ctx context.Context, in *Intake, lastErr string, base, max time.Duration) (n int, age time.Duration, err error) {
	// this write must land even when the run's context is what ended it
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err = l.pool.QueryRow(wctx, `UPDATE file_intake SET `+attemptSet+`
		WHERE intake_id = $1 AND fencing_token = $2 AND state = ANY($6)
		RETURNING attempts, pg_catalog.now() - first_failed_at`,
		in.ID, in.Token, base, max, Text(lastErr, 1000), liveStates).Scan(&n, &age)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, &FencedError{IntakeID: in.ID, Token: in.Token, Step: "record attempt"}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("record attempt: %w", err)
	}
	return n, age, nil
}

// MarkSpent records on a live row, under its fencing token, that its
// retry budget is spent (reason retries_exhausted) when the hold that
// should have ended it failed (its site refused the move, say): the run
// that takes it up next holds it without running it again (endSpent).
func (l *chunkStore) MarkSpent(ctx context.Context, in *Intake) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	tag, err := l.pool.Exec(wctx, `UPDATE file_intake SET reason = 'retries_exhausted', updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = ANY($3)`, in.ID, in.Token, liveStates)
	if err != nil {
		return fmt.Errorf("mark spent: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "mark spent"}
	}
	in.Reason = reason.RetriesExhausted
	return nil
}

// Defer sets the file's next attempt after wait without counting one, under
// its fencing token: the file waits for something that is not its own
// failure (its feed's target table, intake/targethold.go).
func (l *chunkStore) Defer(ctx context.Context, in *Intake, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	tag, err := l.pool.Exec(wctx, `UPDATE file_intake SET next_attempt_at = pg_catalog.now() + $3::interval, updated_at = pg_catalog.now()
		WHERE intake_id = $1 AND fencing_token = $2 AND state = ANY($4)`, in.ID, in.Token, wait, liveStates)
	if err != nil {
		return fmt.Errorf("defer: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "defer"}
	}
	return nil
}

// DataInUse reports whether another intake of the partner than in needs
// the spool entry of in's data bytes: one whose bytes as sent they are,
// whatever its state (the spool holds one entry per hash, and a decrypted
// or expanded copy can be another file's original, which the spool keeps
// for a replay until retention's purge), or an unfinished one that reads
// them as its data. The copy is then kept.
func (l *chunkStore) DataInUse(ctx context.Context, in *Intake) (bool, error) {
	var busy bool
	err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM file_intake WHERE partner_id = $1 AND intake_id <> $3 AND (content_sha256 = $2
		OR data_sha256 = $2 AND state NOT IN ('archived', 'duplicate', 'quarantined', 'failed_terminal', 'discarded', 'put_back')))`,
		in.Partner, in.DataSHA256, in.ID).Scan(&busy)
	return busy, err
}

// ArchivedCopy is the site path of an archived copy of the partner's
// bytes with content hash sha (the newest intake of them archived with
// its file, one that read its bytes before a duplicate, whose hash may
// be its manifest's), or "" when none is: where a replay reads
// its bytes when the spool of the replica running it lacks them.
func (l *chunkStore) ArchivedCopy(ctx context.Context, partner, sha string) (string, error) {
	var p string
	err := l.pool.QueryRow(ctx, `SELECT archive_path FROM file_intake WHERE partner_id = $1 AND content_sha256 = $2
		AND state IN ('archived', 'duplicate') AND archive_path IS NOT NULL AND archive_path <> ''
		ORDER BY state = 'archived' DESC, intake_id DESC LIMIT 1`, partner, sha).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return p, err
}

// ForgetSnapshotKeys drops the keys a snapshot recorded (the target's
// statements write them, see target.Table.RecordKeys), in the
// transaction of its last chunk.
func ForgetSnapshotKeys(ctx context.Context, tx pgx.Tx, intakeID int64) error {
	if _, err := tx.Exec(ctx, `DELETE FROM intake_snapshot_key WHERE intake_id = $1`, intakeID); err != nil {
		return fmt.Errorf("snapshot keys: %w", err)
	}
	return nil
}

// Text is s as a text value PostgreSQL takes: valid UTF-8 (an invalid
// byte becomes U+FFFD), no NUL, at most max bytes cut at a character's
// start. An error's text may carry bytes a server sent (an HTTP status
// line, an SFTP status message): cut inside a character or left invalid,
// PostgreSQL refuses the statement (22021), and the failure it records
// (a delivery's backoff, a file's next attempt) is not recorded at all.
func Text(s string, max int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
