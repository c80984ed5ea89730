package intake

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/partners"
)

// planResult is what validating every row of a spooled file found.
type planResult struct {
	Total    int64
	Rejected int64
	// Fail is set when the file as a whole is unusable (terminal).
	Fail *rows.FileError
	// Hold is a reason code when policy holds the file for ops.
	Hold reason.Code
}

// maxHeldIssues is how many rejected rows a scan keeps in memory, 16
// bytes each (2 MiB); a file with more has them streamed from the spool
// into the database instead, a second read of the whole file.
var maxHeldIssues = 1 << 17

// scan is one validating pass over a file's rows.
type scan struct {
	total, rejected int64
	held            []heldIssue // the first maxHeldIssues rejected rows
	columns         []string    // the columns held issues name, by index
	reasons         []reason.Code
	overflow        bool // more rejected rows than held holds
	fail            *rows.FileError
	err             error // reading failed (not the file's fault)
}

// heldIssue is a rejected row as a scan holds it: its line, and its
// column and reason as indexes into the scan's few distinct ones.
type heldIssue struct {
	line           int64
	column, reason int32
}

// scanRows validates every row of r.
func scanRows(r io.Reader, feed *partners.Feed, maxRows int64) *scan {
	s := &scan{}
	rd, err := rows.NewReader(r, feed, maxRows)
	if err != nil {
		if !errors.As(err, &s.fail) {
			s.err = err
		}
		return s
	}
	for {
		row, err := rd.Next()
		if err == io.EOF {
			return s
		}
		if err != nil {
			if !errors.As(err, &s.fail) {
				s.err = err
			}
			return s
		}
		s.count(row)
	}
}

// count takes one row into the scan.
func (s *scan) count(row *rows.Row) {
	s.total++
	is := row.Issue
	if is == nil {
		return
	}
	s.rejected++
	if len(s.held) >= maxHeldIssues {
		s.overflow = true
		return
	}
	s.held = append(s.held, heldIssue{line: is.Line, column: index(&s.columns, is.Column), reason: index(&s.reasons, is.Reason)})
}

// issue is the held issue i.
func (s *scan) issue(i int) rows.Issue {
	h := s.held[i]
	return rows.Issue{Line: h.line, Column: s.columns[h.column], Reason: s.reasons[h.reason]}
}

// index is v's index in *list, appended when new (a feed's columns and
// the row reasons: a handful).
func index[T comparable](list *[]T, v T) int32 {
	for i, x := range *list {
		if x == v {
			return int32(i)
		}
	}
	*list = append(*list, v)
	return int32(len(*list) - 1)
}

// preScan validates the rows while the file is being downloaded, from the
// spool file as it is written, so the plan step need not read the file
// again (for a file applied ahead, the apply's own reader makes it, in the
// same pass: ahead.go). It is used only for the spool entry it was
// computed from.
type preScan struct {
	sha  string
	done chan *scan
	stop io.Closer
}

// dropPre stops a scan that will not be used (a duplicate, a held file).
func (r *fileRun) dropPre() {
	if r.pre != nil {
		r.pre.stop.Close()
		r.pre = nil
	}
}

// planStage is a spooled file's plan: its batch bound and its rows read
// and judged, then applied, held for approval, held or failed (decide).
type planStage struct{ *fileRun }

// planStage starts the file's plan.
func (r *fileRun) planStage() *planStage { return &planStage{r} }

// plan validates every row from the spool (never the network) and, in one
// transaction, records rejected rows (line, column, reason: never values)
// and the totals; when policy allows, the file moves to applying in the
// same transaction. A scan made during the download of these very bytes
// stands in for reading the spool. Up to maxHeldIssues rejected rows are
// held in memory; beyond that they stream straight from the spool into
// COPY, so memory stays flat however many rows are rejected. Replanning is
// idempotent: the previous plan's rows are deleted first.
func (r *planStage) plan(ctx context.Context) (*planResult, error) {
	in := r.in
	var sc *scan
	if r.pre != nil && r.pre.sha == in.DataSHA256 {
		select {
		case sc = <-r.pre.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		r.dropPre()
	}
	if sc == nil || sc.err != nil || sc.overflow || r.feed.Guarded() || in.ApprovedPlanHash != "" {
		// this plan reads the file from the spool
		if err := r.fetchStage().ensureSpooled(ctx); err != nil || in.State != ledger.StateSpooled {
			return &planResult{}, err
		}
	}
	if sc == nil || sc.err != nil {
		f, err := r.d.spool.Open(in.Partner, in.DataSHA256)
		if err != nil {
			return nil, fmt.Errorf("plan: open spool: %w", err)
		}
		sc = scanRows(f, r.feed, r.p.cfg.Limits.MaxRows)
		f.Close()
		if sc.err != nil {
			return nil, fmt.Errorf("plan: read spool: %w", sc.err)
		}
	}
	res := &planResult{Total: sc.total, Rejected: sc.rejected, Fail: sc.fail}
	if res.Fail != nil {
		return res, nil
	}
	next := "applying"
	switch {
	case in.ExpectedRows != nil && *in.ExpectedRows != res.Total && in.Override != ledger.OverrideManifest:
		res.Hold, next = reason.ManifestMismatch, "spooled"
	case res.Total > 0 && float64(res.Rejected)/float64(res.Total) > r.feed.MaxRejectRatio && in.Override != ledger.OverrideRejectRate:
		res.Hold, next = reason.RejectRate, "spooled"
	}
	if res.Hold == "" && (r.feed.Guarded() || in.ApprovedPlanHash != "") {
		// the feed's files are planned against the target and may wait
		// for a decision (approval.go); without a policy or a delete guard
		// none of this runs (an approved file is held to its plan even
		// when a reload has removed the policy since)
		return res, r.planApproval(ctx, sc, res)
	}
	// One statement moves the file on (fenced) and clears an earlier
	// plan's rows; with no rejected rows it is the whole plan step.
	var err error
	if sc.rejected == 0 {
		err = ledger.Plan(ctx, r.d.db, in, ledger.State(next), res.Total, res.Rejected, r.feed.Hash())
	} else {
		// Recording many rejected rows holds a connection a while; the
		// apply ahead does not take that for another file's. It is counted
		// only once held: a plan still waiting for a connection is one
		// more reason for the apply ahead to give its own up.
		var conn *pgxpool.Conn
		if err = fault.Check("plan:rejected_conn"); err != nil {
			return nil, err
		}
		if conn, err = r.d.db.Acquire(ctx); err == nil {
			a := r.ahead
			if a != nil {
				a.planConns.Add(1)
			}
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if err := ledger.Plan(ctx, tx, in, ledger.State(next), res.Total, res.Rejected, r.feed.Hash()); err != nil {
					return err
				}
				return r.recordIssues(ctx, tx, sc)
			})
			if a != nil {
				a.planConns.Add(-1)
			}
			conn.Release()
		}
	}
	if err != nil {
		return nil, err
	}
	r.planned(sc, res, ledger.State(next))
	return res, nil
}

// planned takes a committed plan into the run: the file's state and
// totals as the plan recorded them, and the rejects report's lines
// rendered from its rejected rows beside what follows (renderRejects).
func (r *planStage) planned(sc *scan, res *planResult, next ledger.State) {
	in := r.in
	in.State, in.RowsTotal, in.RowsRejected = next, res.Total, res.Rejected
	r.d.metrics.RowsTotal.WithLabelValues(in.Partner, "rejected").Add(float64(res.Rejected))
	r.renderRejects(sc)
}

// spooledRows opens the file's spooled data and reads its header again
// (step names the caller in errors).
func (r *fileRun) spooledRows(step string) (*os.File, *rows.Reader, error) {
	f, err := r.d.spool.Open(r.in.Partner, r.in.DataSHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: open spool: %w", step, err)
	}
	rd, err := rows.NewReader(f, r.feed, r.p.cfg.Limits.MaxRows)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: spooled file no longer reads as it did: %w", step, err)
	}
	return f, rd, nil
}

// recordIssues writes the scan's rejected rows: from memory, or, when
// there were more than it holds, streamed from the spool again.
func (r *planStage) recordIssues(ctx context.Context, tx pgx.Tx, sc *scan) error {
	in := r.in
	if !sc.overflow {
		if len(sc.held) == 0 {
			return nil
		}
		_, err := ledger.CopyRejectedRows(ctx, tx,
			pgx.CopyFromSlice(len(sc.held), func(i int) ([]any, error) {
				is := sc.issue(i)
				return issueValues(in, &is), nil
			}))
		if err != nil {
			return fmt.Errorf("plan: record rejected rows: %w", err)
		}
		return nil
	}
	f, rd, err := r.spooledRows("plan")
	if err != nil {
		return err
	}
	defer f.Close()
	src := &issueSource{rd: rd, in: in}
	n, err := ledger.CopyRejectedRows(ctx, tx, src)
	if src.err != nil {
		return fmt.Errorf("plan: spooled file no longer reads as scanned: %w", src.err)
	}
	if err != nil {
		return fmt.Errorf("plan: record rejected rows: %w", err)
	}
	if n != sc.rejected {
		return fmt.Errorf("plan: %d rejected rows recorded, the scan found %d", n, sc.rejected)
	}
	return nil
}

func issueValues(in *ledger.Intake, is *rows.Issue) []any {
	return ledger.RejectedRowValues(in, is.Line, is.Column, is.Reason)
}

// issueSource feeds the rejected rows of a reader to COPY.
type issueSource struct {
	rd    *rows.Reader
	in    *ledger.Intake
	issue *rows.Issue
	err   error
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
		if row.Issue != nil {
			s.issue = row.Issue
			return true
		}
	}
}

func (s *issueSource) Values() ([]any, error) { return issueValues(s.in, s.issue), nil }

func (s *issueSource) Err() error { return s.err }
