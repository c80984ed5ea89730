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

// RecordedAmong returns which of the listed files are claimed already
// (same name, size and mtime), by name. One statement per call: the
// poller asks per batch of a streamed listing, so taken files, which stay
// in ready/ for ever, never crowd out new ones.
func (l *Ledger) RecordedAmong(ctx context.Context, partner string, files []Listed) (map[string]bool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	names := make([]string, len(files))
	sizes := make([]int64, len(files))
	mtimes := make([]time.Time, len(files))
	for i, f := range files {
		names[i], sizes[i], mtimes[i] = f.Name, f.Size, f.MTime.UTC()
	}
	rs, err := l.pool.Query(ctx, `SELECT u.name FROM unnest($2::text[], $3::bigint[], $4::timestamptz[]) AS u(name, size, mtime)
		WHERE EXISTS (SELECT 1 FROM intake_record_claim r
		              WHERE r.partner_id = $1 AND r.name = u.name AND r.size_bytes = u.size AND r.mtime = u.mtime)`,
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

// InsertRecordClaim records a claim of claim: record: the claim row keyed
// by (partner, name, size, mtime) and the intake row (under id, allocated
// before, or a fresh one), in one transaction. ErrTracked when the file is
// claimed already (another replica, or earlier) or a live intake still
// holds its path (the previous version of a changed file): nothing is
// recorded then. It allocates the next claim's id as InsertClaimAt does.
func (l *Ledger) InsertRecordClaim(ctx context.Context, in *Intake, recordName string, id int64) (next int64, err error) {
	if id == 0 {
		if id, err = l.NextIntakeID(ctx); err != nil {
			return 0, err
		}
	}
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO intake_record_claim (partner_id, name, size_bytes, mtime, intake_id)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partner_id, name, size_bytes, mtime) DO NOTHING`,
			in.Partner, recordName, in.ListedSize, in.ListedMTime.UTC(), id)
		if err != nil {
			return fmt.Errorf("record claim: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrTracked
		}
		next, err = l.insertClaim(ctx, tx, in, id)
		return err
	})
	if err != nil {
		if !errors.Is(err, ErrTracked) {
			err = fmt.Errorf("record claim: %w", err)
		}
		return 0, err
	}
	return next, nil
}
