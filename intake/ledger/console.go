package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// The review console's reads: each a page of rows chosen and cut in SQL
// on an indexed order (the queues LIMIT/OFFSET, a plan's changes keyset
// paged), so a queue of many held files or a plan of millions of changes
// is never loaded whole.

// consoleReads holds the review console's reads, each a page cut in SQL,
// of file_intake, intake_quarantine, intake_chunk, intake_row_issue and
// intake_audit.
type consoleReads struct{ *core }

// HeldPage is the open held files of partners, newest first: at most
// limit of them after offset, and how many there are in all.
func (l *consoleReads) HeldPage(ctx context.Context, partners []string, offset, limit int) ([]QuarantineItem, int64, error) {
	var total int64
	if err := l.read.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM intake_quarantine WHERE partner_id = ANY($1) AND state = 'open'`,
		partners).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("held count: %w", err)
	}
	rs, err := l.read.Query(ctx, quarantineItemsSQL+` q.partner_id = ANY($1) AND q.state = 'open'
		ORDER BY q.held_at DESC, q.intake_id DESC LIMIT $2 OFFSET $3`, partners, limit, offset)
	if err != nil {
		return nil, 0, fmt.Errorf("held page: %w", err)
	}
	items, err := pgx.CollectRows(rs, scanQuarantineItem)
	return items, total, err
}

// WaitingPlan is a file awaiting approval as the console lists it.
type WaitingPlan struct {
	IntakeID            int64
	Partner, Feed, File string
	Hash                string
	Counts              json.RawMessage
	PlannedAt           *time.Time
	RowsTotal           int64
}

// WaitingPlans is the files of partners awaiting approval, oldest plan
// first, a page at a time, and how many there are in all.
func (l *consoleReads) WaitingPlans(ctx context.Context, partners []string, offset, limit int) ([]WaitingPlan, int64, error) {
	var total int64
	if err := l.read.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM file_intake WHERE partner_id = ANY($1) AND state = 'awaiting_approval'`,
		partners).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("waiting count: %w", err)
	}
	rs, err := l.read.Query(ctx, `SELECT intake_id, partner_id, feed, remote_name, coalesce(plan_hash, ''), plan_counts, planned_at,
		    coalesce(rows_total, 0)
		FROM file_intake WHERE partner_id = ANY($1) AND state = 'awaiting_approval'
		ORDER BY planned_at, intake_id LIMIT $2 OFFSET $3`, partners, limit, offset)
	if err != nil {
		return nil, 0, fmt.Errorf("waiting page: %w", err)
	}
	ps, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (WaitingPlan, error) {
		var p WaitingPlan
		err := r.Scan(&p.IntakeID, &p.Partner, &p.Feed, &p.File, &p.Hash, &p.Counts, &p.PlannedAt, &p.RowsTotal)
		return p, err
	})
	return ps, total, err
}

// ChangeFilter narrows a page of a plan's changes: Action "" takes every
// action, else only that one; Key "" every key, else the keys it begins
// (the key itself when KeyExact); Column "" every change, else the
// updates that change that column. Each is a condition of the page's
// statement, on an index of intake_plan_change (migration 021): a
// filtered page is cut in SQL as an unfiltered one is.
type ChangeFilter struct {
	Action   string
	Key      string
	KeyExact bool
	Column   string
}

// PlanChangeRow is one change of a plan (intake_plan_change): Seq orders
// the plan's changes (the line for a row of the file; past the last line
// for a delete, whose Line is 0); Changed is {column: [old, new]}.
type PlanChangeRow struct {
	Seq, Line   int64
	Action      string
	Reason, Key string
	Changed     json.RawMessage
}

// PlanChangePage is a page of the changes of a file of one of partners
// that f lets through, in seq order: at most limit of them after seq
// after, or, when before > 0, the last limit before seq before. Keyset
// paging on an index: a page reads about limit rows whatever its place
// in a plan of millions.
func (l *consoleReads) PlanChangePage(ctx context.Context, id int64, partners []string, f ChangeFilter, after, before int64, limit int) ([]PlanChangeRow, error) {
	if !text(f.Key) || !text(f.Column) {
		return nil, nil // no key or column is such a text
	}
	q, args, err := planChangeQuery(id, partners, f, after, before, limit)
	if err != nil {
		return nil, err
	}
	rs, err := l.read.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("plan changes page: %w", err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (PlanChangeRow, error) {
		var c PlanChangeRow
		return c, r.Scan(&c.Seq, &c.Line, &c.Action, &c.Reason, &c.Key, &c.Changed)
	})
	if err != nil {
		return nil, fmt.Errorf("plan changes page: %w", err)
	}
	if before > 0 {
		slices.Reverse(out)
	}
	return out, nil
}

// planChangeQuery writes PlanChangePage's statement: only the conditions
// f sets, so each filter's index serves it (a column through
// intake_plan_change_column, in seq order), the values all parameters.
func planChangeQuery(id int64, partners []string, f ChangeFilter, after, before int64, limit int) (string, []any, error) {
	args := []any{id, partners}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	from, seq := "intake_plan_change c", "c.seq"
	where := []string{"c.intake_id = $1",
		"EXISTS (SELECT 1 FROM file_intake f WHERE f.intake_id = $1 AND f.partner_id = ANY($2))"}
	if f.Column != "" {
		// the column's changes in seq order, then each change by its key
		col := arg(f.Column)
		from, seq = `intake_plan_change_column k JOIN intake_plan_change c ON c.intake_id = k.intake_id AND c.seq = k.seq`, "k.seq"
		where = append(where, "k.intake_id = $1", "k.col = "+col, "c.changed ? "+col)
	}
	if f.Action != "" {
		// a literal of the fixed set: the partial index of every action
		// but update (migration 021) is the planner's only then
		if !slices.Contains(changeActions, f.Action) {
			return "", nil, fmt.Errorf("%w: no action %q", ErrBadFilter, f.Action)
		}
		where = append(where, "c.action = '"+f.Action+"'")
	}
	switch {
	case f.Key != "" && f.KeyExact:
		where = append(where, "c.key = "+arg(f.Key))
	case f.Key != "":
		// a range of the C-ordered key (the key index's), then the prefix
		k := arg(f.Key)
		where = append(where, "c.key >= "+k, "pg_catalog.starts_with(c.key, "+k+")")
		if end, ok := prefixEnd(f.Key); ok {
			where = append(where, "c.key < "+arg(end))
		}
	}
	order := "ASC"
	if before > 0 {
		where, order = append(where, seq+" < "+arg(before)), "DESC"
	} else if after > 0 {
		where = append(where, seq+" > "+arg(after))
	}
	return fmt.Sprintf(`SELECT c.seq, coalesce(c.line, 0), c.action, coalesce(c.reason, ''), c.key, c.changed
		FROM %s WHERE %s ORDER BY %s %s LIMIT %s`, from, strings.Join(where, " AND "), seq, order, arg(limit)), args, nil
}

// text: s is a value a text column can hold (UTF-8, no NUL).
func text(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// changeActions are the actions a plan's change may have.
var changeActions = []string{"create", "update", "delete", "conflict", "rejected"}

// ErrBadFilter: a filter of a page that names no such thing.
var ErrBadFilter = errors.New("no such filter")

// prefixEnd is the least text greater than every text that begins with
// p, byte-wise (UTF-8 orders as its code points do): p with its last
// code point one higher; false when there is none (p is all U+10FFFF).
func prefixEnd(p string) (string, bool) {
	rs := []rune(p)
	for i := len(rs) - 1; i >= 0; i-- {
		r := rs[i] + 1
		if r == 0xD800 {
			r = 0xE000 // past the surrogates, which UTF-8 does not encode
		}
		if r <= utf8.MaxRune {
			return string(append(rs[:i:i], r)), true
		}
	}
	return "", false
}

// FileStory is one file's record as the console shows it: its state and
// times, attempts, chunks, row issues and the names of its archive and
// receipt.
type FileStory struct {
	IntakeID                    int64
	Partner, Feed, File         string
	State, Reason, Worker       string
	BatchID, ContentSHA256      string
	Attempts                    int
	LastError                   string
	ClaimedAt, UpdatedAt        time.Time
	FinishedAt                  *time.Time
	RowsTotal                   int64
	Applied, Unchanged          int64
	Rejected, Conflict, Deleted int64
	AppliedEarlier              int64 // by its runs before a release
	ChunksDone                  int
	ArchivePath, ReceiptPath    string
	ReceiptPending              bool // a discard not yet published: ReceiptPath is the hold's
	RejectsPath, Override       string
	PlanHash, PlanDecision      string
	QState, QReason             string
	HeldAt                      *time.Time
	Hold                        string // HoldToken(HeldAt): what a decision names
	Chunks                      []ChunkRow
	RowIssues                   int64
}

// ChunkRow is one committed chunk of a file.
type ChunkRow struct {
	No                           int
	FirstLine, LastLine          int64
	Applied, Unchanged, Conflict int64
	CommittedAt                  time.Time
}

// Story reads a file of one of partners; nil when there is none.
func (l *consoleReads) Story(ctx context.Context, id int64, partners []string) (*FileStory, error) {
	var s FileStory
	err := l.read.QueryRow(ctx, `SELECT f.intake_id, f.partner_id, f.feed, f.remote_name, f.state, coalesce(f.reason, ''), f.worker_id,
		    coalesce(f.batch_id, ''), coalesce(f.content_sha256, ''), f.attempts, coalesce(f.last_error, ''), f.claimed_at, f.updated_at, f.finished_at,
		    coalesce(f.rows_total, 0), f.rows_applied, f.rows_unchanged, f.rows_rejected, f.rows_conflict, f.rows_deleted, f.rows_applied_earlier, f.chunks_done,
		    coalesce(f.archive_path, ''), coalesce(f.receipt_path, ''), f.receipt_pending, coalesce(f.rejects_path, ''), coalesce(f.release_override, ''),
		    coalesce(f.plan_hash, ''), coalesce(f.plan_decision, ''), coalesce(q.state, ''), coalesce(q.reason, ''), q.held_at,
		    (SELECT pg_catalog.count(*) FROM intake_row_issue i WHERE i.intake_id = f.intake_id)
		FROM file_intake f LEFT JOIN intake_quarantine q USING (intake_id)
		WHERE f.intake_id = $1 AND f.partner_id = ANY($2)`, id, partners).Scan(
		&s.IntakeID, &s.Partner, &s.Feed, &s.File, &s.State, &s.Reason, &s.Worker, &s.BatchID, &s.ContentSHA256, &s.Attempts,
		&s.LastError, &s.ClaimedAt, &s.UpdatedAt, &s.FinishedAt, &s.RowsTotal, &s.Applied, &s.Unchanged, &s.Rejected, &s.Conflict,
		&s.Deleted, &s.AppliedEarlier, &s.ChunksDone, &s.ArchivePath, &s.ReceiptPath, &s.ReceiptPending, &s.RejectsPath, &s.Override, &s.PlanHash, &s.PlanDecision,
		&s.QState, &s.QReason, &s.HeldAt, &s.RowIssues)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("story %d: %w", id, err)
	}
	if s.HeldAt != nil {
		s.Hold = HoldToken(*s.HeldAt)
	}
	rs, err := l.read.Query(ctx, `SELECT chunk_no, first_line, last_line, rows_applied, rows_unchanged, rows_conflict, committed_at
		FROM intake_chunk WHERE intake_id = $1 ORDER BY chunk_no LIMIT 1000`, id)
	if err != nil {
		return nil, fmt.Errorf("story %d chunks: %w", id, err)
	}
	s.Chunks, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (ChunkRow, error) {
		var c ChunkRow
		err := r.Scan(&c.No, &c.FirstLine, &c.LastLine, &c.Applied, &c.Unchanged, &c.Conflict, &c.CommittedAt)
		return c, err
	})
	return &s, err
}

// AuditFilter narrows an audit page: IntakeID > 0 to that file's rows,
// Request to that request's, Text to the rows where it is part of the
// actor, action, reason, detail, partner or database user, or is the
// intake id (case ignored; taken literally: % and _ are no wildcards).
type AuditFilter struct {
	IntakeID int64
	Request  string
	Text     string
}

// likeLiteral is s as a pattern ILIKE … ESCAPE '\' matches literally
// anywhere in a text.
func likeLiteral(s string) string {
	return "%" + strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s) + "%"
}

// AuditPage is the audit rows of partners that f lets through, newest
// first, a page at a time.
func (l *consoleReads) AuditPage(ctx context.Context, partners []string, f AuditFilter, offset, limit int) ([]AuditEntry, error) {
	text := ""
	if f.Text != "" {
		text = likeLiteral(f.Text)
	}
	rs, err := l.read.Query(ctx, `SELECT at, actor, action, partner_id, coalesce(intake_id, 0), reason, coalesce(detail, ''), coalesce(request_id, '')
		FROM intake_audit WHERE partner_id = ANY($1) AND ($2 = 0 OR intake_id = $2) AND ($3 = '' OR request_id = $3)
		  AND ($6 = '' OR actor ILIKE $6 ESCAPE '\' OR action ILIKE $6 ESCAPE '\' OR reason ILIKE $6 ESCAPE '\'
		       OR coalesce(detail, '') ILIKE $6 ESCAPE '\' OR partner_id ILIKE $6 ESCAPE '\'
		       OR coalesce(db_user, '') ILIKE $6 ESCAPE '\' OR coalesce(intake_id::text, '') = $7)
		ORDER BY audit_id DESC LIMIT $4 OFFSET $5`, partners, f.IntakeID, f.Request, limit, offset, text, f.Text)
	if err != nil {
		return nil, fmt.Errorf("audit page: %w", err)
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		err := r.Scan(&a.At, &a.Actor, &a.Action, &a.Partner, &a.IntakeID, &a.Reason, &a.Detail, &a.Request)
		return a, err
	})
}
