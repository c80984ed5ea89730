package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// AwaitAnswer runs read until the database answers it (a result, or an
// error of the server's own), backing off from 100ms to 2s between tries,
// until ctx ends: for a command that lost its database mid-action and must
// say what became of it once the database is back.
func AwaitAnswer[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	wait := 100 * time.Millisecond
	for {
		v, err := read(ctx)
		var pe *pgconn.PgError
		if err == nil || errors.As(err, &pe) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
		if wait < 2*time.Second {
			wait *= 2
		}
	}
}

// Settled is what became of an ops request whose call failed.
type Settled int

// What became of a request.
const (
	// SettledRolledBack: no action carries the request id: its
	// transaction was rolled back or never reached the database; nothing
	// changed.
	SettledRolledBack Settled = iota
	// SettledRecorded: the action was committed (its reply was lost).
	SettledRecorded
	// SettledUnknown: the database did not answer within the wait.
	SettledUnknown
)

// Settle finds out, waiting up to wait for the database to answer, what
// became of an ops request whose call failed: recorded (with the intake
// its audit row names) or rolled back, once no transaction that records
// it is open; unknown when the database stays silent, or that transaction
// stays open, past wait. It waits on a context of its own (bounded by wait), so a
// command whose context ended still learns it when it can.
func (l *opsDecisions) Settle(ctx context.Context, request string, wait time.Duration) (Settled, int64, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	type found struct {
		id int64
		ok bool
	}
	// A commit still in flight when the command lost its connection (a
	// cancelled context, a dropped socket) lands after a read that came
	// too early: its transaction's session is waited for first.
	for {
		open, err := AwaitAnswer(sctx, func(ctx context.Context) (bool, error) { return l.requestInFlight(ctx, request) })
		if err != nil {
			return SettledUnknown, 0, err
		}
		if !open {
			break
		}
		select {
		case <-sctx.Done():
			return SettledUnknown, 0, sctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	f, err := AwaitAnswer(sctx, func(ctx context.Context) (found, error) {
		_, id, ok, err := l.Requested(ctx, request)
		return found{id, ok}, err
	})
	switch {
	case err != nil:
		return SettledUnknown, 0, err
	case f.ok:
		return SettledRecorded, f.id, nil
	}
	return SettledRolledBack, 0, nil
}
