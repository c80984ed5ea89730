package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
)

// Readiness stable: what listings of a partner's ready/ saw, remembered in
// intake_ready_seen so a restart or another replica does not start a file's
// clock again.

// Listed is one candidate of a listing of ready/: its name, size and mtime.
type Listed struct {
	Name  string
	Size  int64
	MTime time.Time
}

// Seen is what the database remembers of a listed file after this
// listing: since when its size and mtime have been the same (Since), and
// the database's clock (Now), which every replica shares.
type Seen struct {
	Since time.Time
	Now   time.Time
}

// forgetSeenAfter: rows of a partner no poll has listed for this long (a
// partner removed from the config, a mode changed) are deleted by any poll.
const forgetSeenAfter = "7 days"

// readySeen holds readiness stable (intake_ready_seen): the entries of
// ready/ seen and when, and the files put back.
type readySeen struct{ *core }

// ObserveReady records a listing of the partner's ready/ and returns, per
// listed name, since when it has been unchanged. In one statement: names
// the listing no longer holds are forgotten (claimed, deleted, or no longer
// among the oldest the listing keeps: their clock starts again when they
// come back, which is never early), a changed size or mtime restarts the
// clock, an unchanged one keeps it. The table thus holds at most the
// listing's kept candidates per partner (max_files_per_poll), whatever the
// directory holds. An empty listing forgets every row of the partner.
func (l *readySeen) ObserveReady(ctx context.Context, partner string, files []Listed) (map[string]Seen, error) {
	files = append([]Listed(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name }) // one lock order for every replica
	names := make([]string, len(files))
	sizes := make([]int64, len(files))
	mtimes := make([]time.Time, len(files))
	for i, f := range files {
		names[i], sizes[i], mtimes[i] = f.Name, f.Size, f.MTime.UTC()
	}
	rs, err := l.pool.Query(ctx, `
		WITH gone AS (
		    DELETE FROM intake_ready_seen
		    WHERE (partner_id = $1 AND NOT (name = ANY($2::text[])))
		       OR last_seen < pg_catalog.now() - $5::interval
		)
		INSERT INTO intake_ready_seen AS s (partner_id, name, size_bytes, mtime, first_seen_unchanged, last_seen)
		SELECT $1, u.name, u.size, u.mtime, pg_catalog.now(), pg_catalog.now()
		FROM unnest($2::text[], $3::bigint[], $4::timestamptz[]) AS u(name, size, mtime)
		ON CONFLICT (partner_id, name) DO UPDATE SET
		    first_seen_unchanged = CASE WHEN s.size_bytes = excluded.size_bytes AND s.mtime = excluded.mtime
		                                THEN s.first_seen_unchanged ELSE excluded.first_seen_unchanged END,
		    size_bytes = excluded.size_bytes, mtime = excluded.mtime, last_seen = excluded.last_seen
		RETURNING name, first_seen_unchanged, pg_catalog.now()`, partner, names, sizes, mtimes, forgetSeenAfter)
	if err != nil {
		return nil, fmt.Errorf("observe ready: %w", err)
	}
	out := make(map[string]Seen, len(files))
	var name string
	var s Seen
	_, err = pgx.ForEachRow(rs, []any{&name, &s.Since, &s.Now}, func() error {
		out[name] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("observe ready: %w", err)
	}
	return out, nil
}

// ForgetReady deletes what listings remembered of a partner's file (it was
// claimed): a file put back later starts its clock again.
func (l *readySeen) ForgetReady(ctx context.Context, partner, name string) error {
	_, err := l.pool.Exec(ctx, `DELETE FROM intake_ready_seen WHERE partner_id = $1 AND name = $2`, partner, name)
	return err
}

// ReadySeenCount is how many files of the partner listings remember.
func (l *readySeen) ReadySeenCount(ctx context.Context, partner string) (int, error) {
	var n int
	err := l.pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM intake_ready_seen WHERE partner_id = $1`, partner).Scan(&n)
	return n, err
}

// MarkPutBack: claimed -> put_back (reason changed_after_claim), before
// the file is renamed back into ready/: the row no longer owns the
// processing path, and a crash before the rename leaves a file there that
// WasPutBack recognises. Conditional on token and state.
func (l *readySeen) MarkPutBack(ctx context.Context, in *Intake) error {
	// claim: record: the claim row goes with it, so the next stable
	// listing claims the file afresh
	var n int
	err := l.pool.QueryRow(ctx, `WITH u AS (
		    UPDATE file_intake SET state = 'put_back', reason = $3, updated_at = pg_catalog.now(), finished_at = pg_catalog.now()
		    WHERE intake_id = $1 AND fencing_token = $2 AND state = 'claimed' RETURNING intake_id),
		d AS (DELETE FROM intake_record_claim WHERE intake_id IN (SELECT intake_id FROM u))
		SELECT pg_catalog.count(*) FROM u`, in.ID, in.Token, string(reason.ChangedAfterClaim)).Scan(&n)
	if err != nil {
		return fmt.Errorf("mark put_back: %w", err)
	}
	if n == 0 {
		return &FencedError{IntakeID: in.ID, Token: in.Token, Step: "mark put_back"}
	}
	in.State, in.Reason = StatePutBack, reason.ChangedAfterClaim
	return nil
}

// WasPutBack reports whether the newest intake of the partner that held
// this processing path ended put_back: a file found there without a live
// row is then one whose rename back into ready/ did not happen (a crash),
// to be put back rather than adopted.
func (l *readySeen) WasPutBack(ctx context.Context, partner, claimedPath string) (bool, error) {
	var st string
	err := l.pool.QueryRow(ctx, `SELECT state FROM file_intake WHERE partner_id = $1 AND claimed_path = $2
		ORDER BY intake_id DESC LIMIT 1`, partner, claimedPath).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return State(st) == StatePutBack, nil
}

// nullTime is t, or NULL when t is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}
