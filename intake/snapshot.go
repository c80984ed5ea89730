package intake

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
)

// Snapshots of one feed apply in claim order, one at a time, across
// replicas. A snapshot is the partner's whole set as of its file: applied
// after a newer one, it would move the table back (its sweep deletes
// what the newer file added, and rows the newer one left as they were
// still carry the older writer). So a snapshot of a feed that already
// holds a newer snapshot's rows ends superseded (archived, nothing more
// applied, its receipt naming the newer intake): looked for when the file
// is planned, and again, under the feed's snapshot lock, in every chunk's
// transaction before it writes a row (ledger.SupersededBy), so that of
// two snapshots the older never commits a row after the newer has begun.
// Its place is the intake whose bytes it applies (a replay's is the file
// replayed): approving, releasing or replaying an older snapshot cannot
// undo a newer one; a replay forced with --force-older
// (OverrideOlder) is the one exception, audited.

// OverrideOlder lets a replay apply a snapshot older than one its feed
// already applied (intake replay --force-older).
const OverrideOlder = "force_older"

// supersededError: a newer snapshot of the feed has begun or applied; the
// chunk's transaction wrote nothing.
type supersededError struct{ newer int64 }

func (e *supersededError) Error() string {
	return fmt.Sprintf("a newer snapshot of the feed (intake %d) has been applied", e.newer)
}

// writer is the intake id the file's rows are written under: its own, or
// for a replay the file whose bytes it applies.
func (r *fileRun) writer() int64 {
	if r.in.ReplayOf != 0 {
		return r.in.ReplayOf
	}
	return r.in.ID
}

// supersededAtPlan ends a snapshot that a newer one of its feed has
// overtaken before it is planned (done: the file ended).
func (r *planStage) supersededAtPlan(ctx context.Context) (done bool, err error) {
	if r.feed.Mode != partners.ModeSnapshot || r.in.Override == OverrideOlder {
		return false, nil
	}
	newer, err := ledger.SupersededBy(ctx, r.d.db, r.in.Partner, r.in.Feed, r.writer(), false)
	if err != nil || newer == 0 {
		return false, err
	}
	r.dropPre()
	r.dropAhead()
	return true, r.supersede(ctx, ledger.StateSpooled, newer)
}

// supersede archives the file as superseded by intake newer.
func (r *fileRun) supersede(ctx context.Context, from ledger.State, newer int64) error {
	r.log.Warn("snapshot older than one its feed already applied: archived as superseded, not applied",
		"reason", string(reason.Superseded), "superseded_by", newer)
	return r.finishStage().archive(ctx, from, ledger.OutcomeSuperseded, newer)
}
