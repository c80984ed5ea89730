package intake

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// transient reports whether err is worth retrying: what pgconn says is safe
// to retry, a SQLSTATE of class 08 (connection), 40001 (serialization),
// 40P01 (deadlock), 57P01/57P02/57P03 (server shutdown or restart), 57014
// (statement timeout) or 25P03 (idle-in-transaction timeout: the server
// ended a stalled session, see PoolConfig), or a network error. Every
// retry passes the fencing gate again, so a retry after a takeover is
// refused there. Validation and fencing errors are never transient.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var fe *ledger.FencedError
	if errors.As(err, &fe) || errors.Is(err, context.Canceled) {
		return false
	}
	// A connection that died under an earlier statement (a server restart):
	// pgconn says not "safe to retry" as a request may have been sent, but
	// a chunk's transaction is rolled back with its connection, and a
	// COMMIT without an answer never gets here (CommitUnknownError).
	if pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) == 5 && pe.Code[:2] == "08":
			return true
		case pe.Code == "40001", pe.Code == "40P01", pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03",
			pe.Code == "57014", pe.Code == "25P03":
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.Timeout(err)
}

// jitter spreads d over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// everyTick calls fn every interval until ctx ends or fn returns false:
// the loop of the heartbeats (a file's, a group's, the replica's).
func everyTick(ctx context.Context, interval time.Duration, fn func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !fn() {
				return
			}
		}
	}
}
