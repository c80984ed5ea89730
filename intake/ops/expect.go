package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// Why AckLate refuses (errors.Is on its error).
var (
	ErrLateUnknown = ledger.ErrLateUnknown
	ErrLateAcked   = ledger.ErrLateAcked
	ErrLateClosed  = ledger.ErrLateNotOpen
)

// AckLate acknowledges the open late window of partner's feed scheduled at
// scheduled (`intake expect ack`): it stops counting in intake_feed_late,
// `intake status` and the IntakeFeedLate alert; audited with actor and
// reason. A window that is unknown, acknowledged already or closed by a
// late file is refused.
func AckLate(ctx context.Context, db *pgxpool.Pool, partner, feed string, scheduled time.Time, actor, reason, request string) (LateWindow, error) {
	return ledgerOn(db).AckLate(ctx, partner, feed, scheduled, actor, reason, request)
}
