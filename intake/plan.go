package intake

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/rows"
)

// planResult is what validating every row of a spooled file found.
type planResult struct {
	Total    int64
	Rejected int64
	// Fail is set when the file as a whole is unusable (terminal).
	Fail *rows.FileError
	// Hold is a reason code when policy holds the file for ops.
	Hold string
}

// plan validates every row from the spool (never the network) and, in one
// transaction, records rejected rows (line, column, reason: never values)
// and the totals; when policy allows, the file moves to applying in the
// same transaction. Rejected rows stream straight into COPY, so memory
// stays flat however many rows are rejected. Replanning is idempotent: the
// previous plan's rows are deleted first.
func (r *fileRun) plan(ctx context.Context) (*planResult, error) {
	in := r.in
	res := &planResult{}
	err := pgx.BeginFunc(ctx, r.d.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE file_intake SET updated_at = now()
			WHERE intake_id = $1 AND fencing_token = $2 AND state = 'spooled'`, in.ID, in.Token)
		if err := fenced(tag, err, in, "plan"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM intake_row_issue WHERE intake_id = $1`, in.ID); err != nil {
			return fmt.Errorf("plan: clear earlier plan: %w", err)
		}
		f, err := r.d.spool.Open(in.Partner, in.DataSHA256)
		if err != nil {
			return fmt.Errorf("plan: open spool: %w", err)
		}
		defer f.Close()
		rd, err := rows.NewReader(f, r.feed, r.p.cfg.Limits.MaxRows)
		var fe *rows.FileError
		if errors.As(err, &fe) {
			res.Fail = fe
			return nil
		}
		if err != nil {
			return err
		}
		src := &issueSource{rd: rd, intake: in.ID, partner: in.Partner}
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"intake_row_issue"},
			[]string{"intake_id", "partner_id", "line", "column_name", "reason", "outcome"}, src)
		if errors.As(src.err, &fe) {
			res.Fail = fe
			return errRollback
		}
		if err != nil {
			return fmt.Errorf("plan: record rejected rows: %w", err)
		}
		res.Total, res.Rejected = src.total, src.rejected
		next := "applying"
		switch {
		case in.ExpectedRows != nil && *in.ExpectedRows != res.Total && in.Override != OverrideManifest:
			res.Hold, next = ReasonManifestMismatch, "spooled"
		case res.Total > 0 && float64(res.Rejected)/float64(res.Total) > r.feed.MaxRejectRatio && in.Override != OverrideRejectRate:
			res.Hold, next = ReasonRejectRate, "spooled"
		}
		tag, err = tx.Exec(ctx, `UPDATE file_intake SET state = $3, rows_total = $4, rows_rejected = $5, updated_at = now()
			WHERE intake_id = $1 AND fencing_token = $2 AND state = 'spooled'`, in.ID, in.Token, next, res.Total, res.Rejected)
		if err := fenced(tag, err, in, "plan"); err != nil {
			return err
		}
		in.State, in.RowsTotal, in.RowsRejected = State(next), res.Total, res.Rejected
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	r.d.metrics.rowsTotal.WithLabelValues(in.Partner, "rejected").Add(float64(res.Rejected))
	return res, nil
}

var errRollback = errors.New("rollback")

// issueSource feeds rejected rows of a reader to COPY.
type issueSource struct {
	rd       *rows.Reader
	intake   int64
	partner  string
	issue    *rows.Issue
	total    int64
	rejected int64
	err      error
}

func (s *issueSource) Next() bool {
	for {
		row, err := s.rd.Next()
		if err == io.EOF {
			return false
		}
		if err != nil {
			s.err = err
			return false
		}
		s.total++
		if row.Issue != nil {
			s.rejected++
			s.issue = row.Issue
			return true
		}
	}
}

func (s *issueSource) Values() ([]any, error) {
	var col any
	if s.issue.Column != "" {
		col = s.issue.Column
	}
	return []any{s.intake, s.partner, s.issue.Line, col, s.issue.Reason, "rejected"}, nil
}

func (s *issueSource) Err() error { return s.err }
