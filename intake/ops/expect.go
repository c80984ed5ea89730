package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// AckLate acknowledges the open late window of partner's feed scheduled at
// scheduled (`intake expect ack`): it stops counting in intake_feed_late,
// `intake status` and the IntakeFeedLate alert; audited with actor and
// reason. A window that is unknown, acknowledged already or closed by a
// late file is refused (errors.Is: ledger.ErrLateUnknown, ErrLateAcked,
// ErrLateNotOpen).
func AckLate(ctx context.Context, db *pgxpool.Pool, partner, feed string, scheduled time.Time, actor, reason, request string) (ledger.LateWindow, error) {
	return ledgerOn(db).AckLate(ctx, partner, feed, scheduled, actor, reason, request)
}
