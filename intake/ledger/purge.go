package ledger

import (
	"context"
	"errors"
	"time"
)

// The statements of retention (intake/ops purge): nothing a file in
// flight or held for ops still needs is touched.

// finishedStates are the states a file no longer leaves by itself.
const finishedStates = `('archived', 'duplicate', 'failed_terminal', 'discarded', 'put_back')`

// settled is the condition on a file_intake row f that retention may let
// what it used go: finished, and not held for an ops decision (a file
// failed for good keeps its quarantine record open until ops release or
// discard it: its row issues are what they review, its spooled bytes
// what a release applies).
const settled = `f.state IN ` + finishedStates + ` AND NOT EXISTS (
	SELECT 1 FROM intake_quarantine q WHERE q.intake_id = f.intake_id AND q.state = 'open')`

// purges deletes what retention lets go: intake_row_issue (with
// intake_snapshot_key), intake_audit and old intake_claim_id rows
// (claimid.go), and reads which spooled files a row of file_intake still
// uses.
type purges struct{ *core }

// PurgeRowIssues deletes the row issues of the partner's files finished
// before cutoff, the snapshot keys of any finished file (a snapshot
// that failed part way leaves its keys; a release starts it over without
// them, so a finished file never needs them), and the plan changes of
// any file no longer awaiting approval (values kept only while ops must
// review them: a decided file that waits again is planned again).
func (l *purges) PurgeRowIssues(ctx context.Context, partner string, cutoff time.Time) (int64, error) {
	if _, err := l.pool.Exec(ctx, `WITH f AS (
		    SELECT intake_id FROM file_intake WHERE partner_id = $1 AND state <> 'awaiting_approval'),
		c AS (DELETE FROM intake_plan_change WHERE intake_id IN (SELECT intake_id FROM f))
		DELETE FROM intake_plan_change_column WHERE intake_id IN (SELECT intake_id FROM f)`, partner); err != nil {
		return 0, err
	}
	if _, err := l.pool.Exec(ctx, `DELETE FROM intake_snapshot_key WHERE intake_id IN (
		SELECT intake_id FROM file_intake WHERE partner_id = $1 AND state IN `+finishedStates+`)`, partner); err != nil {
		return 0, err
	}
	tag, err := l.pool.Exec(ctx, `DELETE FROM intake_row_issue WHERE partner_id = $1 AND intake_id IN (
		SELECT f.intake_id FROM file_intake f WHERE f.partner_id = $1 AND f.finished_at < $2 AND `+settled+`)`, partner, cutoff)
	return tag.RowsAffected(), err
}

// ErrNotPurgeRole: the session's role may not purge the audit (only the
// purge role `intake grants` sets up, and the tables' owner, may).
var ErrNotPurgeRole = errors.New("this database role may not purge the audit (run intake purge as the purge role)")

// PurgeAudit deletes the partner's audit rows older than cutoff through
// intake_purge_audit (migration 016): the audit refuses every other
// DELETE. ErrNotPurgeRole when the session's role may not run it (the
// daemon's: its scheduled purge leaves the audit to the purge role).
func (l *purges) PurgeAudit(ctx context.Context, partner string, cutoff time.Time) (int64, error) {
	// PostgreSQL checks EXECUTE when it prepares the call, even in a
	// branch that does not run: two statements.
	var may bool
	if err := l.pool.QueryRow(ctx, `SELECT pg_catalog.has_function_privilege('intake_purge_audit(text, timestamptz)', 'EXECUTE')`).Scan(&may); err != nil {
		return 0, err
	}
	if !may {
		return 0, ErrNotPurgeRole
	}
	var n int64
	err := l.pool.QueryRow(ctx, `SELECT intake_purge_audit($1::text, $2::timestamptz)`, partner, cutoff).Scan(&n)
	return n, err
}

// SpoolInUse reports which of the partner's spooled hashes a file still
// needs: one in flight or held, or one finished at or after cutoff. One
// query decides for all candidates.
func (l *purges) SpoolInUse(ctx context.Context, partner string, hashes []string, cutoff time.Time) (map[string]bool, error) {
	rs, err := l.pool.Query(ctx, `SELECT h FROM pg_catalog.unnest($2::text[]) h WHERE EXISTS (
		SELECT 1 FROM file_intake f WHERE f.partner_id = $1 AND (f.content_sha256 = h OR f.data_sha256 = h)
		  AND (NOT (`+settled+`) OR f.finished_at >= $3))`,
		partner, hashes, cutoff)
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for rs.Next() {
		var h string
		if err := rs.Scan(&h); err != nil {
			rs.Close()
			return nil, err
		}
		keep[h] = true
	}
	rs.Close()
	return keep, rs.Err()
}
