package intake

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

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
	for _, id := range d.order {
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
		GROUP BY partner_id, state`, d.order)
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
	for _, id := range d.order {
		p := d.parts[id]
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
	for _, id := range d.order {
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
	for _, id := range d.order {
		p := d.parts[id]
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
