package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// claim: record (read-only sites): the claim lives only in
// intake_record_claim, keyed by (partner, name, size, mtime); files are
// never moved.

// recordClaims holds claim: record's rows, intake_record_claim.
type recordClaims struct {
	*core
	claim claimStore // the file's own claim, inserted with its record's
}

// RecordedAmong returns which of the listed files are claimed already
// (same name, size and mtime), by name. One statement per call: the
// poller asks per batch of a streamed listing, so taken files, which stay
// in ready/ for ever, never crowd out new ones.
func (l *recordClaims) RecordedAmong(ctx context.Context, partner string, files []Listed) (map[string]bool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	names := make([]string, len(files))
	sizes := make([]int64, len(files))
	mtimes := make([]time.Time, len(files))
	for i, f := range files {
		names[i], sizes[i], mtimes[i] = f.Name, f.Size, f.MTime.UTC()
	}
	// a claim seen again renews last_seen, at most once a day (so a
	// directory of taken files costs no write at every poll)
	rs, err := l.pool.Query(ctx, `WITH hit AS (
		    SELECT r.name, r.size_bytes, r.mtime, r.last_seen
		    FROM unnest($2::text[], $3::bigint[], $4::timestamptz[]) AS u(name, size, mtime)
		    JOIN intake_record_claim r ON r.partner_id = $1 AND r.name = u.name AND r.size_bytes = u.size AND r.mtime = u.mtime),
		touch AS (
		    UPDATE intake_record_claim r SET last_seen = pg_catalog.now() FROM hit h
		    WHERE r.partner_id = $1 AND r.name = h.name AND r.size_bytes = h.size_bytes AND r.mtime = h.mtime
		      AND h.last_seen < pg_catalog.now() - interval '1 day')
		SELECT name FROM hit`,
		partner, names, sizes, mtimes)
	if err != nil {
		return nil, fmt.Errorf("recorded claims: %w", err)
	}
	out := map[string]bool{}
	var name string
	_, err = pgx.ForEachRow(rs, []any{&name}, func() error {
		out[name] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recorded claims: %w", err)
	}
	return out, nil
}

// InsertRecordClaim records a claim of claim: record: the intake row
// (a fresh id) and the claim row keyed by (partner, name, size, mtime),
// in one transaction. ErrTracked when the file is claimed already
// (another replica, or earlier) or a live intake still holds its path
// (the previous version of a changed file): nothing is recorded then.
func (l *recordClaims) InsertRecordClaim(ctx context.Context, in *Intake, recordName string) error {
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := l.claim.insertClaim(ctx, tx, in); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO intake_record_claim (partner_id, name, size_bytes, mtime, intake_id)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partner_id, name, size_bytes, mtime) DO NOTHING`,
			in.Partner, recordName, in.ListedSize, in.ListedMTime.UTC(), in.ID)
		if err != nil {
			return fmt.Errorf("record claim: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrTracked
		}
		return nil
	})
	if err != nil && !errors.Is(err, ErrTracked) {
		err = fmt.Errorf("record claim: %w", err)
	}
	return err
}

// ForgetRecordClaims deletes the partner's claims whose file no complete
// listing has seen for 7 days (last_seen, renewed by RecordedAmong) and
// whose intake is no longer live: the file left ready/. The table thus
// holds the taken files still in ready/ (and a week of the rest), not
// every file ever taken. Called after a complete listing.
func (l *recordClaims) ForgetRecordClaims(ctx context.Context, partner string) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM intake_record_claim r
		WHERE partner_id = $1 AND last_seen < pg_catalog.now() - interval '7 days'
		  AND NOT EXISTS (SELECT 1 FROM file_intake f WHERE f.intake_id = r.intake_id AND f.state = ANY($2))`,
		partner, holdingStates)
	if err != nil {
		return 0, fmt.Errorf("forget record claims: %w", err)
	}
	return tag.RowsAffected(), nil
}
