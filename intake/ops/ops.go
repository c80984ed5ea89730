// Package ops holds the ops views of cmd/intake: status, the quarantine
// (list, release, discard), the audit trail and retention (purge). Their
// statements go through the ledger (intake/ledger); publishing a decision
// to a partner uses the pipeline's receipts (intake).
package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// ledgerOn is the ledger on db for an ops view. The views grant no lease
// (a replay's is the daemon's), so the default one stands in.
func ledgerOn(db *pgxpool.Pool) *ledger.Ledger { return ledger.New(db, ledger.DefaultLease) }

// Settle finds out what became of an ops request whose call failed
// (ledger.Settle): recorded, rolled back, or unknown after wait.
func Settle(ctx context.Context, db *pgxpool.Pool, request string, wait time.Duration) (ledger.Settled, error) {
	s, _, err := ledgerOn(db).Settle(ctx, request, wait)
	return s, err
}
