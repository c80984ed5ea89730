package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The outbox of notifications (migration 009). Every
// event is inserted by the statement or transaction of the state change
// that causes it, so an event exists exactly when its change committed;
// the delivery service (intake/notify) fans it out to the subscribed
// endpoints and delivers it at least once. Payloads are built here from
// the ledger's own columns: ids, codes and counts, never cell values.

// Events a notification may carry (partners.NotifyEvents lists the same
// names for the config).
const (
	EventQuarantined     = "quarantined"
	EventFailed          = "failed"
	EventRejectedRows    = "rejected_rows"
	EventLate            = "late"
	EventHostKeyMismatch = "host_key_mismatch"
	// EventAwaitingApproval: a file's plan waits for an ops decision
	// (RecordPlan, in the plan's transaction; again after a re-plan). Its
	// payload adds plan_hash.
	EventAwaitingApproval = "awaiting_approval"
)

// filePayload is the payload of a file's event, from its file_intake row f.
const filePayload = `pg_catalog.jsonb_build_object('intake_id', f.intake_id, 'feed', f.feed, 'state', f.state, 'reason', f.reason,
	'batch_id', f.batch_id, 'rows_total', f.rows_total, 'rows_applied', f.rows_applied, 'rows_unchanged', f.rows_unchanged,
	'rows_rejected', f.rows_rejected, 'rows_conflict', f.rows_conflict, 'attempts', f.attempts)`

// fileEventSQL inserts the event $2 of intake $1, from its row as the
// transaction sees it (after its state change).
const fileEventSQL = `INSERT INTO intake_outbox (partner_id, event, payload)
	SELECT f.partner_id, $2, ` + filePayload + ` FROM file_intake f WHERE f.intake_id = $1`

// finishArchivedSQL is finishSQL for archived and duplicate, one statement
// that also writes a rejected_rows event for a file that ends archived
// with rejected rows. It returns the ids of the files it moved.
const finishArchivedSQL = `WITH f AS (` + finishSQL + ` RETURNING fi.*),
	ev AS (INSERT INTO intake_outbox (partner_id, event, payload)
	    SELECT f.partner_id, 'rejected_rows', ` + filePayload + ` FROM f WHERE f.state = 'archived' AND f.rows_rejected > 0)
	SELECT f.intake_id FROM f`

// HostKeyMismatchEvents writes a host_key_mismatch event for each of
// partners that the stored findings (intake_finding, of the previous
// reconciler run) do not already hold a mismatch for: one event per
// episode. It runs in the reconciler's transaction that replaces the
// findings, before the old ones are deleted.
func HostKeyMismatchEvents(ctx context.Context, tx pgx.Tx, partners []string) error {
	if len(partners) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO intake_outbox (partner_id, event, payload)
		SELECT p, 'host_key_mismatch', pg_catalog.jsonb_build_object('reason', 'host_key_mismatch') FROM pg_catalog.unnest($1::text[]) p
		WHERE NOT EXISTS (SELECT 1 FROM intake_finding i WHERE i.partner_id = p AND i.kind = 'host_key_mismatch')`, partners)
	return err
}

// OutboxEvent is an event waiting to be fanned out to its endpoints.
type OutboxEvent struct {
	ID             int64
	Partner, Event string
}

// Endpoint is one webhook an event is delivered to, by its id in the
// config (partners.Notify.EndpointID): the row records no URL or secret.
type Endpoint struct {
	ID string
}

// outboxStore holds notifications: intake_outbox's events fanned out to
// intake_outbox_delivery, the deliveries claimed, acknowledged, failed,
// refused, listed when dead and sent again.
type outboxStore struct{ *core }

// FanOut takes up to limit events not yet fanned out (skipping those
// another replica holds), asks route for each one's endpoints, records a
// pending delivery per endpoint and marks the events fanned out, in one
// transaction. It returns how many events it fanned out.
func (l *outboxStore) FanOut(ctx context.Context, limit int, route func(OutboxEvent) []Endpoint) (int, error) {
	n := 0
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		rs, err := tx.Query(ctx, `SELECT event_id, partner_id, event FROM intake_outbox WHERE NOT fanned_out
			ORDER BY event_id LIMIT $1 FOR UPDATE SKIP LOCKED`, limit)
		if err != nil {
			return err
		}
		evs, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (OutboxEvent, error) {
			var e OutboxEvent
			return e, r.Scan(&e.ID, &e.Partner, &e.Event)
		})
		if err != nil || len(evs) == 0 {
			return err
		}
		var ids, evIDs []int64
		var eps []string
		for _, e := range evs {
			ids = append(ids, e.ID)
			for _, ep := range route(e) {
				evIDs, eps = append(evIDs, e.ID), append(eps, ep.ID)
			}
		}
		if len(evIDs) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, endpoint_id)
				SELECT * FROM unnest($1::bigint[], $2::text[]) ON CONFLICT (event_id, endpoint_id) DO NOTHING`, evIDs, eps); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE intake_outbox SET fanned_out = true WHERE event_id = ANY($1)`, ids); err != nil {
			return err
		}
		n = len(evs)
		return nil
	})
	return n, err
}

// Delivery is one claimed (event, endpoint) to send. EndpointID is all
// the row says of where: the sender takes the URL and the secrets from
// its config.
type Delivery struct {
	EventID        int64
	EndpointID     string
	Attempt        int
	Partner, Event string
	Payload        []byte // the event's payload (JSON)
	CreatedAt      time.Time
}

// ClaimDeliveries leases up to limit pending deliveries that are due and
// not leased by a live claim, for lease, to worker (FOR UPDATE SKIP LOCKED:
// replicas claim different rows). Each claim counts an attempt; the
// attempt number fences the outcome (AckDelivery, FailDelivery).
func (l *outboxStore) ClaimDeliveries(ctx context.Context, worker string, lease time.Duration, limit int) ([]Delivery, error) {
	rs, err := l.pool.Query(ctx, `WITH c AS (
			SELECT event_id, endpoint_id FROM intake_outbox_delivery
			WHERE state = 'pending' AND next_attempt_at <= pg_catalog.now() AND (lease_until IS NULL OR lease_until <= pg_catalog.now())
			ORDER BY next_attempt_at, event_id LIMIT $3 FOR UPDATE SKIP LOCKED),
		d AS (UPDATE intake_outbox_delivery d SET lease_until = pg_catalog.now() + $2::interval, leased_by = $1, attempts = d.attempts + 1
			FROM c WHERE d.event_id = c.event_id AND d.endpoint_id = c.endpoint_id
			RETURNING d.event_id, d.endpoint_id, d.attempts)
		SELECT d.event_id, d.endpoint_id, d.attempts, o.partner_id, o.event, o.payload::text, o.created_at
		FROM d JOIN intake_outbox o USING (event_id) ORDER BY d.event_id`, worker, lease, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		var payload string
		err := r.Scan(&d.EventID, &d.EndpointID, &d.Attempt, &d.Partner, &d.Event, &payload, &d.CreatedAt)
		d.Payload = []byte(payload)
		return d, err
	})
}

// ErrDeliveryLost: the claim's lease passed and another replica claimed
// the delivery again (it will send it too: at least once).
var ErrDeliveryLost = errors.New("delivery claimed again by another replica")

// AckDelivery records the delivery as delivered (fenced by the attempt).
func (l *outboxStore) AckDelivery(ctx context.Context, d Delivery, worker string, status int) error {
	tag, err := l.pool.Exec(ctx, `UPDATE intake_outbox_delivery SET state = 'delivered', delivered_at = pg_catalog.now(), lease_until = NULL,
		last_status = $5, last_error = NULL
		WHERE event_id = $1 AND endpoint_id = $2 AND leased_by = $3 AND attempts = $4 AND state = 'pending'`,
		d.EventID, d.EndpointID, worker, d.Attempt, status)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrDeliveryLost
	}
	return nil
}

// FailDelivery records a failed attempt: the delivery is due again after
// backoff, or dead once its budget (from budget_from) is spent. It
// reports whether the delivery is now dead.
func (l *outboxStore) FailDelivery(ctx context.Context, d Delivery, worker string, status int, reason string, backoff, budget time.Duration) (bool, error) {
	reason = Text(reason, 300)
	var state string
	err := l.pool.QueryRow(ctx, `UPDATE intake_outbox_delivery SET lease_until = NULL, last_status = nullif($5, 0), last_error = $6,
		state = CASE WHEN budget_from + $8::interval <= pg_catalog.now() + $7::interval THEN 'dead' ELSE 'pending' END,
		dead_at = CASE WHEN budget_from + $8::interval <= pg_catalog.now() + $7::interval THEN pg_catalog.now() END,
		next_attempt_at = pg_catalog.now() + $7::interval
		WHERE event_id = $1 AND endpoint_id = $2 AND leased_by = $3 AND attempts = $4 AND state = 'pending'
		RETURNING state`, d.EventID, d.EndpointID, worker, d.Attempt, status, reason, backoff, budget).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, ErrDeliveryLost
	}
	if err != nil {
		return false, err
	}
	return state == "dead", nil
}

// RefuseDelivery marks a claimed delivery dead at once, unsent, with
// reason (its endpoint is not in the config: retrying cannot help until
// ops change the config and send it again).
func (l *outboxStore) RefuseDelivery(ctx context.Context, d Delivery, worker, reason string) error {
	tag, err := l.pool.Exec(ctx, `UPDATE intake_outbox_delivery SET lease_until = NULL, last_status = NULL, last_error = $5,
		state = 'dead', dead_at = pg_catalog.now()
		WHERE event_id = $1 AND endpoint_id = $2 AND leased_by = $3 AND attempts = $4 AND state = 'pending'`,
		d.EventID, d.EndpointID, worker, d.Attempt, Text(reason, 300))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrDeliveryLost
	}
	return nil
}

// OutboxGauges is what the delivery gauges describe, cluster-wide.
type OutboxGauges struct {
	Pending          int64
	OldestPendingAge time.Duration
	// DeadRecent: deliveries marked dead within the window asked for.
	DeadRecent int64
	Unfanned   int64
}

// OutboxState reads the gauges; deadWithin is how far back dead
// deliveries count.
func (l *outboxStore) OutboxState(ctx context.Context, deadWithin time.Duration) (OutboxGauges, error) {
	var g OutboxGauges
	var age float64
	err := l.pool.QueryRow(ctx, `SELECT
		(SELECT pg_catalog.count(*) FROM intake_outbox_delivery WHERE state = 'pending'),
		(SELECT coalesce(extract(epoch FROM pg_catalog.now() - pg_catalog.min(o.created_at)), 0)::float8 FROM intake_outbox_delivery d
		    JOIN intake_outbox o USING (event_id) WHERE d.state = 'pending'),
		(SELECT pg_catalog.count(*) FROM intake_outbox_delivery WHERE state = 'dead' AND dead_at > pg_catalog.now() - $1::interval),
		(SELECT pg_catalog.count(*) FROM intake_outbox WHERE NOT fanned_out)`, deadWithin).Scan(&g.Pending, &age, &g.DeadRecent, &g.Unfanned)
	g.OldestPendingAge = time.Duration(age * float64(time.Second))
	return g, err
}

// PurgeOutbox deletes events older than keep that have no pending
// delivery (delivered, dead past keep, or sent to nobody), at most limit.
func (l *outboxStore) PurgeOutbox(ctx context.Context, keep time.Duration, limit int) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM intake_outbox WHERE event_id IN (
		SELECT o.event_id FROM intake_outbox o WHERE o.fanned_out AND o.created_at < pg_catalog.now() - $1::interval
		  AND NOT EXISTS (SELECT 1 FROM intake_outbox_delivery d WHERE d.event_id = o.event_id AND d.state = 'pending')
		ORDER BY o.event_id LIMIT $2)`, keep, limit)
	if err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}
