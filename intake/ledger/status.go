package ledger

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements behind `intake status` and the daemon's gauges: what
// the ledger says of each partner, and each replica's last poll of it.

// PollRecord is what one partner's polls since the last write say: the
// last successful poll (OKAt) and the last failed one (ErrAt); a zero
// time is none of that kind.
type PollRecord struct {
	Partner string
	OKAt    time.Time
	Ready   int
	Oldest  time.Time // the oldest ready file's modification time, zero if none
	ErrAt   time.Time
	Err     string // ours (paths, codes), never file contents: valid UTF-8, no NUL, at most 500 bytes
}

// recordPollsSQL is RecordPolls's statement.
var recordPollsSQL = `INSERT INTO intake_partner_poll AS t
	    (partner_id, worker_id, last_ok_at, ready_files, oldest_ready_at, last_error_at, last_error)
	SELECT u.p, $2, pg_catalog.statement_timestamp() - u.ok_ago * interval '1 microsecond', u.ready, u.oldest,
	    pg_catalog.statement_timestamp() - u.err_ago * interval '1 microsecond', u.err
	FROM unnest($1::text[], $3::bigint[], $4::int[], $5::timestamptz[], $6::bigint[], $7::text[])
	    AS u(p, ok_ago, ready, oldest, err_ago, err)
	ORDER BY u.p
	ON CONFLICT (partner_id, worker_id) DO UPDATE SET
	    last_ok_at = CASE WHEN ` + newer("last_ok_at") + ` THEN excluded.last_ok_at ELSE t.last_ok_at END,
	    ready_files = CASE WHEN ` + newer("last_ok_at") + ` THEN excluded.ready_files ELSE t.ready_files END,
	    oldest_ready_at = CASE WHEN ` + newer("last_ok_at") + ` THEN excluded.oldest_ready_at ELSE t.oldest_ready_at END,
	    last_error_at = CASE WHEN ` + newer("last_error_at") + ` THEN excluded.last_error_at ELSE t.last_error_at END,
	    last_error = CASE WHEN ` + newer("last_error_at") + ` THEN excluded.last_error ELSE t.last_error END`

// statusReads holds intake status's reads of file_intake (gauges, state
// counts, files and their progress) and the polls it shows
// (intake_partner_poll).
type statusReads struct{ *core }

// RecordPolls stores the outcomes of this worker's polls for `intake
// status`, every partner's in one statement (a daemon of 1,000 partners
// `@every 30s` writes one a second, not 33 committed writes). A
// successful poll sets last_ok_at and the ready files; a failed one
// last_error_at and its text; neither touches the other's columns, and
// neither moves a column back to an older poll's. Each time is written
// as the database's clock less how long ago the poll ended, measured
// once the connection is in hand: the ledger's times stay on one clock.
func (l *statusReads) RecordPolls(ctx context.Context, worker string, polls []PollRecord) error {
	if len(polls) == 0 {
		return nil
	}
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	ids := make([]string, len(polls))
	okAgo := make([]*int64, len(polls))
	ready := make([]int32, len(polls))
	oldest := make([]*time.Time, len(polls))
	errAgo := make([]*int64, len(polls))
	errText := make([]*string, len(polls))
	for i, p := range polls {
		ids[i] = p.Partner
		if !p.OKAt.IsZero() {
			us := time.Since(p.OKAt).Microseconds()
			okAgo[i] = &us
			ready[i] = int32(min(p.Ready, 1<<31-1))
			if !p.Oldest.IsZero() {
				oldest[i] = &polls[i].Oldest
			}
		}
		if !p.ErrAt.IsZero() {
			us := time.Since(p.ErrAt).Microseconds()
			errAgo[i] = &us
			t := Text(polls[i].Err, maxPollError)
			errText[i] = &t
		}
	}
	_, err = conn.Exec(ctx, recordPollsSQL,
		ids, worker, okAgo, ready, oldest, errAgo, errText)
	return err
}

// newer: the incoming row has a time in column c later than the stored
// one (or the stored one has none).
func newer(c string) string {
	return "excluded." + c + " IS NOT NULL AND (t." + c + " IS NULL OR excluded." + c + " > t." + c + ")"
}

// Gauge is one partner's files in one state, for the daemon's gauges.
type Gauge struct {
	Partner string
	State   State
	Files   int64
	// Age is how long ago the oldest of them finished or was claimed (s);
	// for awaiting_approval, since its plan started to wait.
	Age float64
	// Rows, RowsDone, Bytes, BytesDone: the progress of files applying.
	Rows, RowsDone, Bytes, BytesDone float64
}

// Gauges reads the partners' files per state that the gauges describe.
func (l *statusReads) Gauges(ctx context.Context, partners []string) ([]Gauge, error) {
	rs, err := l.pool.Query(ctx, `SELECT partner_id, state, pg_catalog.count(*),
		extract(epoch FROM pg_catalog.now() - pg_catalog.min(coalesce(finished_at, CASE WHEN state = 'awaiting_approval' THEN planned_at END, claimed_at)))::float8,
		coalesce(pg_catalog.sum(rows_total - rows_rejected) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(pg_catalog.sum(rows_applied + rows_unchanged + rows_conflict) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(pg_catalog.sum(size_bytes) FILTER (WHERE state = 'applying'), 0)::float8,
		coalesce(pg_catalog.sum(size_bytes * (rows_applied + rows_unchanged + rows_conflict) / nullif(rows_total - rows_rejected, 0))
		    FILTER (WHERE state = 'applying'), 0)::float8
		FROM file_intake WHERE state IN ('claimed', 'spooled', 'applying', 'applied', 'outcome_unknown', 'quarantined', 'awaiting_approval')
		  AND partner_id = ANY($1)
		GROUP BY partner_id, state`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Gauge, error) {
		var g Gauge
		err := r.Scan(&g.Partner, &g.State, &g.Files, &g.Age, &g.Rows, &g.RowsDone, &g.Bytes, &g.BytesDone)
		return g, err
	})
}

// StateCount is one partner's files in one state, for `intake status`.
type StateCount struct {
	Partner string
	State   State
	Files   int64
	// Age: how long ago the oldest of them was claimed.
	Age time.Duration
	// Rows and RowsDone: the progress of files applying.
	Rows, RowsDone int64
}

// StateCounts reads the partners' files per state.
func (l *statusReads) StateCounts(ctx context.Context, partners []string) ([]StateCount, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, state, pg_catalog.count(*),
		coalesce(extract(epoch FROM pg_catalog.now() - pg_catalog.min(claimed_at)), 0)::float8,
		coalesce(pg_catalog.sum(rows_total - rows_rejected) FILTER (WHERE state = 'applying'), 0)::bigint,
		coalesce(pg_catalog.sum(rows_applied + rows_unchanged + rows_conflict) FILTER (WHERE state = 'applying'), 0)::bigint
		FROM file_intake WHERE partner_id = ANY($1) GROUP BY partner_id, state`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (StateCount, error) {
		var c StateCount
		var age float64
		err := r.Scan(&c.Partner, &c.State, &c.Files, &age, &c.Rows, &c.RowsDone)
		c.Age = time.Duration(age * float64(time.Second))
		return c, err
	})
}

// HoldCount is one partner's open holds: files held for an ops decision
// (their quarantine record open), whether quarantined or failed for good.
type HoldCount struct {
	Partner string
	Files   int64
	Oldest  time.Duration // since the oldest of them was held
}

// OpenHolds counts the partners' open holds: what waits for `intake
// quarantine release` or `discard`, for status, the gauges and the
// reconciler's findings alike.
func (l *statusReads) OpenHolds(ctx context.Context, partners []string) ([]HoldCount, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, pg_catalog.count(*),
		coalesce(extract(epoch FROM pg_catalog.now() - pg_catalog.min(held_at)), 0)::float8
		FROM intake_quarantine WHERE state = 'open' AND partner_id = ANY($1) GROUP BY partner_id`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (HoldCount, error) {
		var h HoldCount
		var age float64
		err := r.Scan(&h.Partner, &h.Files, &age)
		h.Oldest = time.Duration(age * float64(time.Second))
		return h, err
	})
}

// Poll is the last poll of a partner by any replica.
type Poll struct {
	Partner           string
	LastOK, LastError *time.Time
	LastErrorText     string
	ReadyFiles        int64
	OldestReady       *time.Time
}

// Polls reads the partners' last polls.
func (l *statusReads) Polls(ctx context.Context, partners []string) ([]Poll, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, pg_catalog.max(last_ok_at), pg_catalog.max(last_error_at),
		(pg_catalog.array_agg(last_error ORDER BY last_error_at DESC NULLS LAST))[1],
		(pg_catalog.array_agg(ready_files ORDER BY last_ok_at DESC NULLS LAST))[1],
		(pg_catalog.array_agg(oldest_ready_at ORDER BY last_ok_at DESC NULLS LAST))[1]
		FROM intake_partner_poll WHERE partner_id = ANY($1) GROUP BY partner_id`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Poll, error) {
		var p Poll
		var lastErr *string
		var ready *int64
		err := r.Scan(&p.Partner, &p.LastOK, &p.LastError, &lastErr, &ready, &p.OldestReady)
		if lastErr != nil {
			p.LastErrorText = *lastErr
		}
		if ready != nil {
			p.ReadyFiles = *ready
		}
		return p, err
	})
}

// Applying is a file being applied, and how far it got.
type Applying struct {
	Partner        string
	IntakeID       int64
	Worker         string
	RowsDone, Rows int64
	Bytes          int64
	ChunksDone     int64
}

// ApplyingFiles lists the partners' files being applied, in id order.
func (l *statusReads) ApplyingFiles(ctx context.Context, partners []string) ([]Applying, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, intake_id, worker_id, rows_applied + rows_unchanged + rows_conflict,
		coalesce(rows_total, 0) - rows_rejected, coalesce(size_bytes, 0), chunks_done
		FROM file_intake WHERE partner_id = ANY($1) AND state = 'applying' ORDER BY intake_id`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Applying, error) {
		var a Applying
		err := r.Scan(&a.Partner, &a.IntakeID, &a.Worker, &a.RowsDone, &a.Rows, &a.Bytes, &a.ChunksDone)
		return a, err
	})
}

// endedStates are the states a file ends in (a held one until ops decide).
var endedStates = []string{string(StateArchived), string(StateDuplicate), string(StateQuarantined),
	string(StateFailedTerminal), string(StateDiscarded), string(StatePutBack)}

// Finished lists the files of every partner that ended, with an id above
// after, oldest first (the demo's summary).
func (l *statusReads) Finished(ctx context.Context, after int64) ([]*Intake, error) {
	return l.query(ctx, `intake_id > $1 AND state = ANY($2)`, after, endedStates)
}

// Progress counts the files of every partner that ended, and the rows done
// and to do of the files being applied (the demo's progress bar).
func (l *statusReads) Progress(ctx context.Context) (finished int, rowsDone, rows int64, err error) {
	err = l.pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FILTER (WHERE state = ANY($1)),
		coalesce(pg_catalog.sum(rows_applied + rows_unchanged + rows_conflict) FILTER (WHERE state = 'applying'), 0),
		coalesce(pg_catalog.sum(rows_total - rows_rejected) FILTER (WHERE state = 'applying'), 0)
		FROM file_intake`, endedStates).Scan(&finished, &rowsDone, &rows)
	return finished, rowsDone, rows, err
}

// Files lists every file of the partner, oldest first.
func (l *statusReads) Files(ctx context.Context, partner string) ([]*Intake, error) {
	return l.query(ctx, `partner_id = $1`, partner)
}

// maxPollError bounds a poll's recorded error text: Text makes it valid
// UTF-8 without NUL (a server's message can be anything, and PostgreSQL
// refuses either in text), cut on a character's start.
const maxPollError = 500
