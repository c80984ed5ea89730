package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StatusRow is one partner's line of `intake status`.
type StatusRow struct {
	Partner          string
	ByState          map[string]int64
	OldestProcessing time.Duration
	QuarantineOpen   int64
	QuarantineOldest time.Duration
	InflightTotal    int64
	InflightDone     int64
	LastOK           *time.Time
	LastError        *time.Time
	LastErrorText    string
	ReadyFiles       int64
	OldestReady      *time.Time
	Findings         []StatusFinding
	// OrphanClaims: files the last reconciler run found in a processing/
	// dir with no live row and left there (claims with no outcome yet).
	OrphanClaims int
	FindingsAt   *time.Time // when the reconciler last completed a run; nil: never
	Inflight     []InflightFile
	// Replicas are the live replicas serving the partner; Poller is the one
	// that polls it under affinity "partner" (affinity.go).
	Replicas []string
	Poller   string
}

// InflightFile is a file being applied, and how far it got.
type InflightFile struct {
	IntakeID           int64
	Worker             string
	RowsDone, Rows     int64
	BytesDone, Bytes   int64
	Chunks, ChunksDone int64
}

// StatusFinding is a finding of the last reconciler run.
type StatusFinding struct {
	Kind, Path, Action, Detail string
	IntakeID                   int64
	NeedsHuman                 bool
}

// Status reads what `intake status` shows, for the given partners.
func Status(ctx context.Context, db *pgxpool.Pool, partners []string) ([]StatusRow, error) {
	out := make([]StatusRow, len(partners))
	idx := map[string]*StatusRow{}
	for i, p := range partners {
		out[i] = StatusRow{Partner: p, ByState: map[string]int64{}}
		idx[p] = &out[i]
	}
	rs, err := db.Query(ctx, `SELECT partner_id, state, count(*),
		coalesce(extract(epoch FROM now() - min(claimed_at)), 0)::float8,
		coalesce(sum(rows_total - rows_rejected) FILTER (WHERE state = 'applying'), 0)::bigint,
		coalesce(sum(rows_applied + rows_unchanged + rows_conflict) FILTER (WHERE state = 'applying'), 0)::bigint
		FROM file_intake WHERE partner_id = ANY($1) GROUP BY partner_id, state`, partners)
	if err != nil {
		return nil, err
	}
	for rs.Next() {
		var p, st string
		var n, total, done int64
		var age float64
		if err := rs.Scan(&p, &st, &n, &age, &total, &done); err != nil {
			rs.Close()
			return nil, err
		}
		r := idx[p]
		r.ByState[st] = n
		d := time.Duration(age * float64(time.Second))
		switch State(st) {
		case StateQuarantined:
			r.QuarantineOpen, r.QuarantineOldest = n, d
		case StateClaimed, StateSpooled, StateApplying, StateApplied, StateOutcomeUnknown:
			r.OldestProcessing = max(r.OldestProcessing, d)
		}
		r.InflightTotal += total
		r.InflightDone += done
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, err
	}
	rs, err = db.Query(ctx, `SELECT partner_id, max(last_ok_at), max(last_error_at),
		(array_agg(last_error ORDER BY last_error_at DESC NULLS LAST))[1],
		(array_agg(ready_files ORDER BY last_ok_at DESC NULLS LAST))[1],
		(array_agg(oldest_ready_at ORDER BY last_ok_at DESC NULLS LAST))[1]
		FROM intake_partner_poll WHERE partner_id = ANY($1) GROUP BY partner_id`, partners)
	if err != nil {
		return nil, err
	}
	for rs.Next() {
		var p string
		var lastErr *string
		var ready *int64
		r := &StatusRow{}
		if err := rs.Scan(&p, &r.LastOK, &r.LastError, &lastErr, &ready, &r.OldestReady); err != nil {
			rs.Close()
			return nil, err
		}
		t := idx[p]
		t.LastOK, t.LastError, t.OldestReady = r.LastOK, r.LastError, r.OldestReady
		if lastErr != nil {
			t.LastErrorText = *lastErr
		}
		if ready != nil {
			t.ReadyFiles = *ready
		}
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, err
	}
	rs, err = db.Query(ctx, `SELECT partner_id, intake_id, worker_id, rows_applied + rows_unchanged + rows_conflict,
		coalesce(rows_total, 0) - rows_rejected, coalesce(size_bytes, 0), chunks_done
		FROM file_intake WHERE partner_id = ANY($1) AND state = 'applying' ORDER BY intake_id`, partners)
	if err != nil {
		return nil, err
	}
	for rs.Next() {
		var p string
		var f InflightFile
		if err := rs.Scan(&p, &f.IntakeID, &f.Worker, &f.RowsDone, &f.Rows, &f.Bytes, &f.ChunksDone); err != nil {
			rs.Close()
			return nil, err
		}
		if f.Rows > 0 {
			f.BytesDone = f.Bytes * f.RowsDone / f.Rows
		}
		idx[p].Inflight = append(idx[p].Inflight, f)
	}
	rs.Close()
	rs, err = db.Query(ctx, `SELECT partner_id, run_at FROM intake_reconcile_run WHERE partner_id = ANY($1)`, partners)
	if err != nil {
		return nil, err
	}
	for rs.Next() {
		var p string
		var at time.Time
		if err := rs.Scan(&p, &at); err != nil {
			rs.Close()
			return nil, err
		}
		idx[p].FindingsAt = &at
	}
	rs.Close()
	rs, err = db.Query(ctx, `SELECT partner_id, kind, coalesce(intake_id, 0), coalesce(path, ''), action, needs_human,
		coalesce(detail, '') FROM intake_finding WHERE partner_id = ANY($1) ORDER BY partner_id, kind`, partners)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	for rs.Next() {
		var p string
		var f StatusFinding
		if err := rs.Scan(&p, &f.Kind, &f.IntakeID, &f.Path, &f.Action, &f.NeedsHuman, &f.Detail); err != nil {
			return nil, err
		}
		idx[p].Findings = append(idx[p].Findings, f)
		if f.Kind == "orphan_claim" && f.IntakeID == 0 { // reconcile.KindOrphanClaim, not adopted
			idx[p].OrphanClaims++
		}
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	serving, err := (&store{pool: db}).liveServing(ctx)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Replicas = serving[out[i].Partner]
		if len(out[i].Replicas) > 0 {
			out[i].Poller = owner(out[i].Partner, out[i].Replicas)
		}
	}
	return out, nil
}
