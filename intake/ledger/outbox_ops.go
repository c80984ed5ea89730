package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// What ops do with deliveries whose retry budget ran out: list them and,
// once the endpoint is fixed, send them again with a fresh budget.

// DeadDelivery is a webhook delivery marked dead (its budget spent).
type DeadDelivery struct {
	EventID        int64
	Partner, Event string
	EndpointID     string // the id of its endpoint in the config
	Attempts       int
	LastStatus     int // 0: no HTTP answer
	LastError      string
	CreatedAt      time.Time
	DeadAt         time.Time
}

// DeadDeliveries lists the dead deliveries of the given partners, oldest
// death first, at most limit.
func (l *outboxStore) DeadDeliveries(ctx context.Context, partners []string, limit int) ([]DeadDelivery, error) {
	rs, err := l.pool.Query(ctx, `SELECT d.event_id, o.partner_id, o.event, d.endpoint_id, d.attempts, coalesce(d.last_status, 0),
		coalesce(d.last_error, ''), o.created_at, d.dead_at
		FROM intake_outbox_delivery d JOIN intake_outbox o USING (event_id)
		WHERE d.state = 'dead' AND o.partner_id = ANY($1)
		ORDER BY d.dead_at, d.event_id, d.endpoint_id LIMIT $2`, partners, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (DeadDelivery, error) {
		var d DeadDelivery
		err := r.Scan(&d.EventID, &d.Partner, &d.Event, &d.EndpointID, &d.Attempts, &d.LastStatus, &d.LastError, &d.CreatedAt, &d.DeadAt)
		return d, err
	})
}

// Redelivery says which dead deliveries to send again: those of event
// EventID (0: every event) to the endpoints Endpoints names by id (nil:
// every endpoint), of Partners.
type Redelivery struct {
	Partners      []string
	EventID       int64
	Endpoints     []string
	Actor, Reason string
	// Request is the command's request id, on the request's audit row.
	Request string
}

// Redeliver makes the dead deliveries r selects pending again, due now and
// with a fresh retry budget, and audits each one, in one transaction. Only
// a dead delivery changes (a delivery that is pending or delivered is left
// alone, so two operators redelivering at once send it once more, not
// twice); the attempt count goes on rising, so it still fences the
// outcome of each attempt. It returns how many deliveries it revived.
func (l *outboxStore) Redeliver(ctx context.Context, r Redelivery) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		// the request audited first: the grants' row-level security lets
		// an ops role change deliveries only once the change is audited
		// (grants.sql); each delivery revived is audited after
		what := "every dead delivery"
		if r.EventID != 0 {
			what = fmt.Sprintf("the dead deliveries of event %d", r.EventID)
		}
		if r.Endpoints != nil {
			what += " to endpoints " + strings.Join(r.Endpoints, ", ")
		}
		scope := AllPartners
		if len(r.Partners) == 1 {
			scope = r.Partners[0]
		}
		if err := auditRequest(ctx, tx, r.Request, r.Actor, "notify_redeliver_request", scope, 0, r.Reason, what); err != nil {
			return err
		}
		rs, err := tx.Query(ctx, `UPDATE intake_outbox_delivery d SET state = 'pending', dead_at = NULL, budget_from = pg_catalog.now(),
			next_attempt_at = pg_catalog.now(), lease_until = NULL, leased_by = NULL
			FROM intake_outbox o
			WHERE o.event_id = d.event_id AND d.state = 'dead' AND o.partner_id = ANY($1)
			  AND ($2 = 0 OR d.event_id = $2) AND ($4 OR d.endpoint_id = ANY($3::text[]))
			RETURNING o.partner_id, d.event_id, o.event`, r.Partners, r.EventID, r.Endpoints, r.Endpoints == nil)
		if err != nil {
			return err
		}
		type revived struct {
			partner string
			id      int64
			event   string
		}
		got, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (revived, error) {
			var v revived
			return v, row.Scan(&v.partner, &v.id, &v.event)
		})
		if err != nil {
			return err
		}
		for _, v := range got {
			if err := audit(ctx, tx, r.Actor, "notify_redeliver", v.partner, 0, r.Reason,
				fmt.Sprintf("event %d (%s)", v.id, v.event)); err != nil {
				return err
			}
		}
		n = int64(len(got))
		if n == 0 {
			return errNothingRevived // nothing done: the request's audit row goes too
		}
		return nil
	})
	if errors.Is(err, errNothingRevived) {
		return 0, nil
	}
	return n, err
}

var errNothingRevived = errors.New("no dead delivery matches")
