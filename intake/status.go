package intake

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// recordPoll stores the outcome of a poll for `intake status`. The error
// text is ours (paths, codes), never file contents.
func (s *store) recordPoll(ctx context.Context, partner, worker string, pollErr error, ready int, oldest time.Time) error {
	var oldestAt any
	if !oldest.IsZero() {
		oldestAt = oldest
	}
	var err error
	if pollErr == nil {
		_, err = s.pool.Exec(ctx, `INSERT INTO intake_partner_poll (partner_id, worker_id, last_ok_at, ready_files, oldest_ready_at)
			VALUES ($1, $2, now(), $3, $4)
			ON CONFLICT (partner_id, worker_id) DO UPDATE SET last_ok_at = now(), ready_files = $3, oldest_ready_at = $4`,
			partner, worker, ready, oldestAt)
	} else {
		msg := pgerr.Redact(pollErr)
		if len(msg) > 500 {
			msg = msg[:500]
		}
		_, err = s.pool.Exec(ctx, `INSERT INTO intake_partner_poll (partner_id, worker_id, last_error_at, last_error)
			VALUES ($1, $2, now(), $3)
			ON CONFLICT (partner_id, worker_id) DO UPDATE SET last_error_at = now(), last_error = $3`, partner, worker, msg)
	}
	return err
}

// refreshGauges sets the gauges that describe the whole pipeline as the
// database sees it: files per state, oldest file in processing, open
// quarantine, progress of files being applied. Every replica reports the
// same cluster-wide numbers; alert rules aggregate with max().
func (d *Daemon) refreshGauges(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := d.metrics
	order := d.partnerIDs() // a reload may change them meanwhile
	for _, id := range order {
		for _, st := range []State{StateClaimed, StateSpooled, StateApplying, StateApplied, StateOutcomeUnknown, StateQuarantined} {
			m.files.WithLabelValues(id, string(st)).Set(0)
		}
		m.oldestProcessing.WithLabelValues(id).Set(0)
		m.quarantineOpen.WithLabelValues(id).Set(0)
		m.quarantineOldest.WithLabelValues(id).Set(0)
		m.inflightRows.WithLabelValues(id).Set(0)
		m.inflightRowsDone.WithLabelValues(id).Set(0)
		m.inflightBytes.WithLabelValues(id).Set(0)
		m.inflightBytesDone.WithLabelValues(id).Set(0)
	}
	oldest := map[string]float64{}
	rs, err := d.db.Query(ctx, `SELECT partner_id, state, count(*), extract(epoch FROM now() - min(coalesce(finished_at, claimed_at)))::float8,
		coalesce(sum(rows_total - rows_rejected) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(sum(rows_applied + rows_unchanged + rows_conflict) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(sum(size_bytes) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(sum(size_bytes * (rows_applied + rows_unchanged + rows_conflict) / nullif(rows_total - rows_rejected, 0))
		    FILTER (WHERE state = 'applying'), 0)::float8
		FROM file_intake WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown', 'quarantined')
		  AND partner_id = ANY($1)
		GROUP BY partner_id, state`, order)
	if err != nil {
		return fmt.Errorf("refresh gauges: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var partner, state string
		var n int64
		var age, total, done, bytes, bytesDone float64
		if err := rs.Scan(&partner, &state, &n, &age, &total, &done, &bytes, &bytesDone); err != nil {
			return err
		}
		m.files.WithLabelValues(partner, state).Set(float64(n))
		switch State(state) {
		case StateQuarantined:
			m.quarantineOpen.WithLabelValues(partner).Set(float64(n))
			m.quarantineOldest.WithLabelValues(partner).Set(age)
		default:
			if age > oldest[partner] {
				oldest[partner] = age
			}
		}
		if State(state) == StateApplying {
			m.inflightRows.WithLabelValues(partner).Set(total)
			m.inflightRowsDone.WithLabelValues(partner).Set(done)
			m.inflightBytes.WithLabelValues(partner).Set(bytes)
			m.inflightBytesDone.WithLabelValues(partner).Set(bytesDone)
		}
	}
	for p, age := range oldest {
		m.oldestProcessing.WithLabelValues(p).Set(age)
	}
	for _, p := range d.partnerList() {
		id := p.cfg.ID
		p.statMu.Lock()
		age, polling := 0.0, p.polling
		if !p.oldestReady.IsZero() {
			age = time.Since(p.oldestReady).Seconds()
		}
		p.statMu.Unlock()
		if polling { // else another replica speaks for the partner's ready/
			m.oldestReady.WithLabelValues(id).Set(age)
		}
	}
	return rs.Err()
}

// refreshSpoolBytes walks the spool and sets the bytes held per partner.
func (d *Daemon) refreshSpoolBytes() {
	for _, id := range d.partnerIDs() {
		var total int64
		filepath.WalkDir(filepath.Join(d.spool.Dir(), id), func(_ string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if info, err := e.Info(); err == nil {
					total += info.Size()
				}
			}
			return nil
		})
		d.metrics.spoolBytes.WithLabelValues(id).Set(float64(total))
	}
}

// PartnerState is what the daemon knows of a partner's site right now.
type PartnerState struct {
	Up        bool      `json:"up"`
	LastOK    time.Time `json:"last_ok,omitempty"`
	LastError string    `json:"last_error,omitempty"`
	// PolledElsewhere: another live replica polls the partner (partner
	// affinity); this one's last poll of it would be stale, so the other
	// fields are left empty and that replica's /readyz speaks for it.
	PolledElsewhere bool `json:"polled_elsewhere,omitempty"`
}

// PartnerStates reports each partner's SFTP state as of the last poll.
func (d *Daemon) PartnerStates() map[string]PartnerState {
	out := map[string]PartnerState{}
	for _, p := range d.partnerList() {
		id := p.cfg.ID
		p.statMu.Lock()
		if p.elsewhere {
			out[id] = PartnerState{PolledElsewhere: true}
		} else {
			out[id] = PartnerState{Up: p.up, LastOK: p.lastOK, LastError: p.lastErr}
		}
		p.statMu.Unlock()
	}
	return out
}

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
