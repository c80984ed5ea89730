package ops

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// DeadDeliveries lists the given partners' dead deliveries, oldest first.
func DeadDeliveries(ctx context.Context, db *pgxpool.Pool, partners []string, limit int) ([]ledger.DeadDelivery, error) {
	return ledgerOn(db).DeadDeliveries(ctx, partners, limit)
}

// Redeliver sends the dead deliveries r selects again with a fresh
// retry budget (audited); a running daemon's notifier delivers them.
func Redeliver(ctx context.Context, db *pgxpool.Pool, r ledger.Redelivery) (int64, error) {
	return ledgerOn(db).Redeliver(ctx, r)
}
