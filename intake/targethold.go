package intake

import (
	"context"
	"errors"
	"fmt"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
)

// A feed whose target table intake cannot write is held: its files stay
// in ready/ and the rest go on (intake/targethold says how and why). The
// daemon's Keeper is Daemon.feedHolds; each partner runtime keeps its
// held feeds (partnerRT.holds).

// HeldFeeds names the feeds held now, as "partner/feed" in order: a
// one-shot run that held one ends with code 1 (needs attention).
func (d *Daemon) HeldFeeds() []string { return d.feedHolds.Names() }

// holdPartners are the runtimes as the holds see them.
func holdPartners(ps []*partnerRT) []targethold.Partner {
	out := make([]targethold.Partner, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// Config is the runtime's partner config (targethold.Partner).
func (p *partnerRT) Config() *partners.Config { return p.cfg }

// Holds are the runtime's held feeds (targethold.Partner).
func (p *partnerRT) Holds() *targethold.Feeds { return &p.holds }

// Retired reports whether a reload replaced or removed the runtime
// (targethold.Partner).
func (p *partnerRT) Retired() bool { return p.retired() }

// errFeedHeld: the file's feed is held; the file waits for its table
// without an attempt counted (settle defers it).
var errFeedHeld = errors.New("the feed's target table cannot be written")

// targetTable is the file's target table. A feed held (or found unusable
// now, and held from now on) makes the file wait: errFeedHeld, which
// settle turns into a deferred next attempt, not a counted one. The steps
// before the table (download, hash, the duplicate decision, an archive
// after the rows committed, a rejection's quarantine) run while it is
// held; only planning and applying wait.
func (r *fileRun) targetTable(ctx context.Context) (*target.Table, error) {
	if r.p != nil && r.p.holds.Held(r.feed.Name) {
		return nil, errFeedHeld
	}
	tgt, err := r.d.targets.Get(ctx, r.feed)
	if err != nil && r.p != nil && targethold.Unusable(err) {
		r.d.feedHolds.Set(r.p, r.feed, pgerr.Redact(err))
		return nil, fmt.Errorf("%w: %w", errFeedHeld, err)
	}
	return tgt, err
}

// partnerOrNil is p as a targethold.Partner, nil for none.
func partnerOrNil(p *partnerRT) targethold.Partner {
	if p == nil {
		return nil
	}
	return p
}
