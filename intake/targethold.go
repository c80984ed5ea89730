package intake

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/partners"
)

// A feed whose target table intake cannot write is held. The table does
// not exist, lacks partner_id or last_intake_id, has no unique index on
// (partner_id, key...), compares partner ids loosely, does not take a feed
// column (target.Load's *target.Error: the database's answer, not a
// failure to ask it). While the feed is held its files stay in ready/
// untouched, and the partner's other feeds and every other partner go on.
// The table is read again at most every targetRetry while files of the
// feed are listed, so the feed resumes by itself once ops fix the table.
//
// Before, one such feed stopped them all: a daemon whose config named it
// did not start, and `intake run --once` polled no partner (CheckTargets
// returned the first error). A reload still refuses a config that would
// hold a feed the config in force writes (reload.go checkFeeds): there a
// working mapping is kept; at a start there is none to keep.
//
// A table that breaks after it was loaded (dropped, altered) is met by the
// file's statements: the file ends target_error, which ops replay after
// the fix (docs/failure-matrix.md).

// targetRetry is how long a held feed waits before its table is read
// again.
var targetRetry = 30 * time.Second

// feedHold is why a feed is held and when its table is read again.
type feedHold struct {
	problem string // the *target.Error: the table and what it lacks; never a value
	since   time.Time
	next    time.Time
}

// feedUsable reports whether the feed's target can be written, loading it
// when it is not yet (a cache hit otherwise). A held feed's table is read
// again only once its retry is due. err is a failure to ask the database,
// for the poll to retry: it holds nothing.
func (d *Daemon) feedUsable(ctx context.Context, p *partnerRT, f *partners.Feed) (bool, error) {
	p.holdMu.Lock()
	h := p.holds[f.Name]
	p.holdMu.Unlock()
	if h != nil && time.Now().Before(h.next) {
		return false, nil
	}
	_, err := d.targets.Get(ctx, f)
	var te *target.Error
	switch {
	case err == nil:
		d.setFeedHeld(p, f, nil)
		return true, nil
	case errors.As(err, &te):
		d.setFeedHeld(p, f, te)
		return false, nil
	default:
		return false, err
	}
}

// setFeedHeld holds the feed for te, or lets it go (te nil), logging the
// change and setting intake_feed_target_held.
func (d *Daemon) setFeedHeld(p *partnerRT, f *partners.Feed, te *target.Error) {
	now := time.Now()
	p.holdMu.Lock()
	h := p.holds[f.Name]
	switch {
	case te == nil && h == nil:
	case te == nil:
		delete(p.holds, f.Name)
	case h == nil:
		if p.holds == nil {
			p.holds = map[string]*feedHold{}
		}
		p.holds[f.Name] = &feedHold{problem: te.Error(), since: now, next: now.Add(targetRetry)}
	default:
		h.problem, h.next = te.Error(), now.Add(targetRetry)
	}
	p.holdMu.Unlock()
	if !p.retired() { // a replaced runtime's successor speaks for the partner
		held := 0.0
		if te != nil {
			held = 1
		}
		d.metrics.targetHeld.WithLabelValues(p.cfg.ID, f.Name).Set(held)
	}
	switch {
	case te != nil && h == nil:
		d.log.Error("feed held: its target table cannot be written; its files stay in ready/ until it can",
			"partner", p.cfg.ID, "feed", f.Name, "target", f.Target, "reason", string(partners.SkipTargetUnusable), "problem", te.Detail)
	case te == nil && h != nil:
		d.log.Info("feed's target table can be written again: its files are taken", "partner", p.cfg.ID, "feed", f.Name,
			"target", f.Target, "held_for", now.Sub(h.since).Round(time.Second).String())
	}
}

// heldFeeds is the partner's held feeds and why (PartnerStates).
func (p *partnerRT) heldFeeds() map[string]string {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	if len(p.holds) == 0 {
		return nil
	}
	out := make(map[string]string, len(p.holds))
	for name, h := range p.holds {
		out[name] = h.problem
	}
	return out
}

// HeldFeeds names the feeds held now, as "partner/feed" in order: a
// one-shot run that held one ends with code 1 (needs attention).
func (d *Daemon) HeldFeeds() []string {
	var out []string
	for _, p := range d.partnerList() {
		for name := range p.heldFeeds() {
			out = append(out, p.cfg.ID+"/"+name)
		}
	}
	sort.Strings(out)
	return out
}

// feedGate answers, for one poll's listing, whether a feed's files may be
// claimed: each feed is asked once per poll (feedUsable).
type feedGate struct {
	d     *Daemon
	p     *partnerRT
	known map[*partners.Feed]bool
}

func (d *Daemon) newFeedGate(p *partnerRT) *feedGate {
	return &feedGate{d: d, p: p, known: map[*partners.Feed]bool{}}
}

func (g *feedGate) usable(ctx context.Context, f *partners.Feed) (bool, error) {
	if ok, seen := g.known[f]; seen {
		return ok, nil
	}
	ok, err := g.d.feedUsable(ctx, g.p, f)
	if err != nil {
		return false, err
	}
	g.known[f] = ok
	return ok, nil
}
