package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The statements of expected deliveries (intake/expect; migration 009):
// per feed, how far its windows are decided (intake_feed_expect), and the
// windows that closed without an accepted file (intake_feed_late).

// ExpectState is how far a feed's windows are decided.
type ExpectState struct {
	Since, LastScheduled, LastDeadline time.Time
}

// LateWindow is a window that closed without an accepted file.
type LateWindow struct {
	Partner, Feed       string
	Scheduled, Deadline time.Time
	RaisedAt            time.Time
	RaisedBy            string
	// ClosedBy is the intake that arrived late and closed the window (0:
	// still open); ArrivedAt is when that file was claimed.
	ClosedBy  int64
	ArrivedAt *time.Time
	// AckedAt, AckedBy and AckReason: ops acknowledged the window (AckLate);
	// an acknowledged window is no longer counted as open late. AckedAt
	// nil: not acknowledged.
	AckedAt   *time.Time
	AckedBy   string
	AckReason string
}

// DeliveryFile is an accepted file of the feed (applied or archived): a
// delivery.
type DeliveryFile struct {
	IntakeID  int64
	ClaimedAt time.Time
}

// ExpectTx is one feed's evaluation: a transaction holding the feed's
// intake_feed_expect row locked, so replicas evaluate a feed one at a time
// and decide each window once.
type ExpectTx struct {
	tx            pgx.Tx
	partner, feed string
}

// expectations holds expected deliveries: intake_feed_expect evaluated
// one feed at a time, and the late windows of intake_feed_late.
type expectations struct{ *core }

// EvaluateExpect runs fn in a transaction that holds (partner, feed)'s
// expect row locked, creating it at now when absent, and commits what fn
// wrote. fn's error rolls everything back.
func (l *expectations) EvaluateExpect(ctx context.Context, partner, feed string, now time.Time, fn func(*ExpectTx, ExpectState) error) error {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO intake_feed_expect (partner_id, feed, since, last_scheduled, last_deadline)
		VALUES ($1, $2, $3, $3, $3) ON CONFLICT (partner_id, feed) DO NOTHING`, partner, feed, now); err != nil {
		return err
	}
	var st ExpectState
	if err := tx.QueryRow(ctx, `SELECT since, last_scheduled, last_deadline FROM intake_feed_expect
		WHERE partner_id = $1 AND feed = $2 FOR UPDATE`, partner, feed).Scan(&st.Since, &st.LastScheduled, &st.LastDeadline); err != nil {
		return err
	}
	if err := fn(&ExpectTx{tx: tx, partner: partner, feed: feed}, st); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// OpenLate lists the feed's late windows no file has closed yet, oldest
// first, acknowledged ones included: a file that arrives late for an
// acknowledged window still closes it and counts for no other window.
func (e *ExpectTx) OpenLate(ctx context.Context) ([]LateWindow, error) {
	rs, err := e.tx.Query(ctx, `SELECT scheduled_at, deadline, raised_at, raised_by FROM intake_feed_late
		WHERE partner_id = $1 AND feed = $2 AND closed_intake_id IS NULL ORDER BY scheduled_at`, e.partner, e.feed)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (LateWindow, error) {
		w := LateWindow{Partner: e.partner, Feed: e.feed}
		return w, r.Scan(&w.Scheduled, &w.Deadline, &w.RaisedAt, &w.RaisedBy)
	})
}

// DeliverySpan is a span of claim times, both ends excluded.
type DeliverySpan struct{ After, Before time.Time }

// SpanDeliveries is what a span holds of the feed's deliveries: its first
// accepted file (IntakeID 0: none) and how many accepted files it holds,
// counted up to two.
type SpanDeliveries struct {
	First DeliveryFile
	Count int
}

// Deliveries reads, for each span, the feed's accepted files (applied or
// archived) claimed in it that have closed no late window: the first,
// and how many, up to two. One statement, one bounded index scan per span
// (file_intake_feed_claimed): the work is the number of spans, never the
// number of files the feed received.
func (e *ExpectTx) Deliveries(ctx context.Context, spans []DeliverySpan) ([]SpanDeliveries, error) {
	if len(spans) == 0 {
		return nil, nil
	}
	after := make([]time.Time, len(spans))
	before := make([]time.Time, len(spans))
	for i, s := range spans {
		after[i], before[i] = s.After, s.Before
	}
	rs, err := e.tx.Query(ctx, `SELECT coalesce(x.ids[1], 0), coalesce(x.ats[1], s.a), coalesce(pg_catalog.cardinality(x.ids), 0)
		FROM unnest($3::timestamptz[], $4::timestamptz[]) WITH ORDINALITY AS s(a, b, i)
		LEFT JOIN LATERAL (
		    SELECT pg_catalog.array_agg(f.intake_id ORDER BY f.claimed_at, f.intake_id) AS ids,
		           pg_catalog.array_agg(f.claimed_at ORDER BY f.claimed_at, f.intake_id) AS ats
		    FROM (SELECT f.intake_id, f.claimed_at FROM file_intake f
		        WHERE f.partner_id = $1 AND f.feed = $2 AND f.claimed_at > s.a AND f.claimed_at < s.b
		          AND f.state IN ('applied', 'archived')
		          AND NOT EXISTS (SELECT 1 FROM intake_feed_late l WHERE l.closed_intake_id = f.intake_id)
		        ORDER BY f.claimed_at, f.intake_id LIMIT 2) f) x ON true
		ORDER BY s.i`, e.partner, e.feed, after, before)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (SpanDeliveries, error) {
		var d SpanDeliveries
		return d, r.Scan(&d.First.IntakeID, &d.First.ClaimedAt, &d.Count)
	})
}

// FirstPending is when the feed's first file still in flight (claimed,
// spooled, applying, outcome_unknown, awaiting_approval) claimed after
// after was claimed; zero when there is none.
func (e *ExpectTx) FirstPending(ctx context.Context, after time.Time) (time.Time, error) {
	var at *time.Time
	err := e.tx.QueryRow(ctx, `SELECT f.claimed_at FROM file_intake f
		WHERE f.partner_id = $1 AND f.feed = $2 AND f.claimed_at > $3
		  AND f.state IN ('claimed', 'spooled', 'applying', 'outcome_unknown', 'awaiting_approval')
		ORDER BY f.claimed_at LIMIT 1`, e.partner, e.feed, after).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) || at == nil {
		return time.Time{}, nil
	}
	return *at, err
}

// RaiseLate records the window of scheduled as late, once, with its late
// notification (outbox.go) in the same statement: it reports whether this
// call wrote the row (false: it was already recorded).
func (e *ExpectTx) RaiseLate(ctx context.Context, scheduled, deadline time.Time, worker string) (bool, error) {
	var n int
	err := e.tx.QueryRow(ctx, `WITH l AS (INSERT INTO intake_feed_late (partner_id, feed, scheduled_at, deadline, raised_by)
		    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partner_id, feed, scheduled_at) DO NOTHING RETURNING *),
		ev AS (INSERT INTO intake_outbox (partner_id, event, payload)
		    SELECT l.partner_id, 'late', pg_catalog.jsonb_build_object('feed', l.feed, 'scheduled_at', l.scheduled_at, 'deadline', l.deadline) FROM l)
		SELECT pg_catalog.count(*) FROM l`,
		e.partner, e.feed, scheduled, deadline, worker).Scan(&n)
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// ErrLateNotOpen: the late window was closed already (by another file).
var ErrLateNotOpen = errors.New("late window already closed")

// CloseLate closes the open late window of scheduled with the intake that
// arrived late (conditional on the window being open).
func (e *ExpectTx) CloseLate(ctx context.Context, scheduled time.Time, intakeID int64, arrived time.Time) error {
	tag, err := e.tx.Exec(ctx, `UPDATE intake_feed_late SET closed_intake_id = $4, arrived_at = $5, closed_at = pg_catalog.now()
		WHERE partner_id = $1 AND feed = $2 AND scheduled_at = $3 AND closed_intake_id IS NULL`,
		e.partner, e.feed, scheduled, intakeID, arrived)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return ErrLateNotOpen
	}
	return nil
}

// Advance records how far the feed's windows are decided.
func (e *ExpectTx) Advance(ctx context.Context, lastScheduled, lastDeadline time.Time) error {
	_, err := e.tx.Exec(ctx, `UPDATE intake_feed_expect SET last_scheduled = $3, last_deadline = $4, evaluated_at = pg_catalog.now()
		WHERE partner_id = $1 AND feed = $2`, e.partner, e.feed, lastScheduled, lastDeadline)
	return err
}

// LateCount is a feed's late windows still open.
type LateCount struct {
	Partner, Feed string
	Open          int64
}

// OpenLateCounts counts the open late windows per feed of the partners
// that ops have not acknowledged.
func (l *expectations) OpenLateCounts(ctx context.Context, partners []string) ([]LateCount, error) {
	rs, err := l.pool.Query(ctx, `SELECT partner_id, feed, pg_catalog.count(*) FROM intake_feed_late
		WHERE partner_id = ANY($1) AND closed_intake_id IS NULL AND acked_at IS NULL GROUP BY partner_id, feed`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (LateCount, error) {
		var c LateCount
		return c, r.Scan(&c.Partner, &c.Feed, &c.Open)
	})
}

// LateWindows lists the partners' late windows that are open and not
// acknowledged, or were closed or acknowledged within the last
// `shownFor`, newest first, at most limit of each partner (one partner's
// pile never hides another's), and how many of each partner's such
// windows there are in all.
func (l *expectations) LateWindows(ctx context.Context, partners []string, shownFor time.Duration, limit int) ([]LateWindow, map[string]int, error) {
	rs, err := l.read.Query(ctx, `SELECT partner_id, feed, scheduled_at, deadline, raised_at, raised_by, closed, arrived_at, acked_at, acked_by, ack_reason, total
		FROM (SELECT partner_id, feed, scheduled_at, deadline, raised_at, raised_by,
		        coalesce(closed_intake_id, 0) AS closed, arrived_at, acked_at, coalesce(acked_by, '') AS acked_by, coalesce(ack_reason, '') AS ack_reason,
		        pg_catalog.row_number() OVER (PARTITION BY partner_id ORDER BY scheduled_at DESC) AS n,
		        pg_catalog.count(*) OVER (PARTITION BY partner_id) AS total
		    FROM intake_feed_late
		    WHERE partner_id = ANY($1)
		      AND ((closed_intake_id IS NULL AND acked_at IS NULL)
		        OR closed_at > pg_catalog.now() - $2::interval OR acked_at > pg_catalog.now() - $2::interval)) w
		WHERE n <= $3
		ORDER BY scheduled_at DESC`, partners, shownFor, limit)
	if err != nil {
		return nil, nil, err
	}
	totals := map[string]int{}
	ws, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (LateWindow, error) {
		var w LateWindow
		var total int
		err := r.Scan(&w.Partner, &w.Feed, &w.Scheduled, &w.Deadline, &w.RaisedAt, &w.RaisedBy, &w.ClosedBy, &w.ArrivedAt,
			&w.AckedAt, &w.AckedBy, &w.AckReason, &total)
		totals[w.Partner] = total
		return w, err
	})
	return ws, totals, err
}

// Why AckLate refused: the window is not a late window of the feed, ops
// acknowledged it already, or a file that arrived late closed it.
var (
	ErrLateUnknown = errors.New("no late window of the feed is scheduled at that time")
	ErrLateAcked   = errors.New("late window already acknowledged")
)

// LateAckRefused says why an acknowledgement changed nothing: Err is
// ErrLateUnknown, ErrLateAcked or ErrLateNotOpen, and Window the window as
// it is (zero for ErrLateUnknown).
type LateAckRefused struct {
	Err    error
	Window LateWindow
}

func (e *LateAckRefused) Error() string {
	switch {
	case errors.Is(e.Err, ErrLateAcked):
		return fmt.Sprintf("%v: by %s at %s (%s)", e.Err, e.Window.AckedBy, e.Window.AckedAt.UTC().Format(time.RFC3339), e.Window.AckReason)
	case errors.Is(e.Err, ErrLateNotOpen):
		return fmt.Sprintf("%v: intake %d arrived for it", e.Err, e.Window.ClosedBy)
	}
	return e.Err.Error()
}

func (e *LateAckRefused) Unwrap() error { return e.Err }

// AckLate records that actor acknowledged the open late window of
// (partner, feed) scheduled at scheduled, with reason, and audits it, in
// one transaction. The acknowledgement is one conditional statement: it
// changes only a late window that is neither acknowledged nor closed, so
// two operators acknowledging at once record one acknowledgement, and a
// window a late file closed meanwhile is left as the file closed it.
// Anything else is refused with a *LateAckRefused.
func (l *expectations) AckLate(ctx context.Context, partner, feed string, scheduled time.Time, actor, reason, request string) (LateWindow, error) {
	var w LateWindow
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		// the audit row first: the grants' row-level security lets an
		// ops role change the window only once the change is audited
		// (grants.sql); a refusal rolls both back
		if err := auditRequest(ctx, tx, request, actor, "expect_ack", partner, 0, reason,
			fmt.Sprintf("feed %s, window scheduled %s", feed, scheduled.UTC().Format(time.RFC3339))); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `UPDATE intake_feed_late SET acked_at = pg_catalog.now(), acked_by = $4, ack_reason = $5
			WHERE partner_id = $1 AND feed = $2 AND scheduled_at = $3 AND closed_intake_id IS NULL AND acked_at IS NULL
			RETURNING partner_id, feed, scheduled_at, deadline, raised_at, raised_by, acked_at, acked_by, ack_reason`,
			partner, feed, scheduled, actor, reason).Scan(&w.Partner, &w.Feed, &w.Scheduled, &w.Deadline, &w.RaisedAt, &w.RaisedBy,
			&w.AckedAt, &w.AckedBy, &w.AckReason)
		if errors.Is(err, pgx.ErrNoRows) {
			return ackRefused(ctx, tx, partner, feed, scheduled)
		}
		return err
	})
	return w, err
}

// ackRefused reads why AckLate's statement changed nothing.
func ackRefused(ctx context.Context, tx pgx.Tx, partner, feed string, scheduled time.Time) error {
	w := LateWindow{Partner: partner, Feed: feed}
	err := tx.QueryRow(ctx, `SELECT scheduled_at, deadline, coalesce(closed_intake_id, 0), arrived_at, acked_at, coalesce(acked_by, ''), coalesce(ack_reason, '')
		FROM intake_feed_late WHERE partner_id = $1 AND feed = $2 AND scheduled_at = $3`, partner, feed, scheduled).
		Scan(&w.Scheduled, &w.Deadline, &w.ClosedBy, &w.ArrivedAt, &w.AckedAt, &w.AckedBy, &w.AckReason)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &LateAckRefused{Err: ErrLateUnknown}
	case err != nil:
		return err
	case w.AckedAt != nil:
		return &LateAckRefused{Err: ErrLateAcked, Window: w}
	}
	return &LateAckRefused{Err: ErrLateNotOpen, Window: w}
}
