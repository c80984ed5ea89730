package intake

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
)

// A feed whose target table intake cannot write is held. The table does
// not exist, lacks partner_id or last_intake_id, has no unique index on
// (partner_id, key...), compares partner ids loosely, does not take a feed
// column (target.Load's *target.Error), or PostgreSQL refuses to describe
// it (class 42: a schema the role may not use). While the feed is held its
// files stay in ready/ untouched; its files already claimed go on up to
// the table (download, duplicate decision, an archive after their rows
// committed) and then wait, deferred without an attempt counted
// (targetTable, settle), their owner renewing their lease at each resume;
// and the partner's other feeds and every other partner go on. Every
// replica reads a held feed's table again every targetRetry (gaugeLoop,
// and a poll that lists a file of it), whether files wait or not, so the
// hold ends by itself once ops fix the table.
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
	problem string // the table and what it lacks, or the SQLSTATE; never a value
	since   time.Time
	next    time.Time
}

// feedUsable reports whether the feed's target can be written, loading it
// when it is not yet (a cache hit otherwise). A held feed's table is read
// again only once its retry is due, and a failure to ask the database
// then keeps it held until the next retry. err is a failure to ask the
// database about a feed not held, for the poll to retry.
func (d *Daemon) feedUsable(ctx context.Context, p *partnerRT, f *partners.Feed) (bool, error) {
	p.holdMu.Lock()
	h := p.holds[f.Name]
	due := h == nil || !time.Now().Before(h.next)
	p.holdMu.Unlock()
	if !due {
		return false, nil
	}
	_, err := d.targets.Get(ctx, f)
	switch {
	case err == nil:
		if d.setFeedHeld(p, f, "") {
			d.logFindings(ctx, target.NewChecker(d.db), p.cfg.ID, f) // as at a start
		}
		return true, nil
	case unusableTarget(err):
		d.setFeedHeld(p, f, pgerr.Redact(err))
		return false, nil
	case h != nil && ctx.Err() == nil:
		// held, and the database did not answer this time: held still
		d.log.Warn("held feed's target table not read again; tried at the next retry", "partner", p.cfg.ID, "feed", f.Name,
			"target", f.Target, "err", err)
		p.holdMu.Lock()
		if h := p.holds[f.Name]; h != nil {
			h.next = time.Now().Add(targetRetry)
		}
		p.holdMu.Unlock()
		return false, nil
	default:
		return false, err
	}
}

// unusableTarget reports whether err is the database's answer that the
// target cannot be written (target.Load's finding, or class 42 about the
// table: a schema the role may not use), rather than a failure to ask it
// (a connection refused, the server full, a password rotated: not a
// property of the table).
func unusableTarget(err error) bool {
	var te *target.Error
	if errors.As(err, &te) {
		return true
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "42") && !errors.As(err, &ce)
}

// recheckHeld reads the table of every held feed whose retry is due
// (gaugeLoop), files waiting or not, each within 10 s, and sets every
// feed's gauge from what its partner's current runtime holds.
func (d *Daemon) recheckHeld(ctx context.Context) {
	for _, p := range d.partnerList() {
		for i := range p.cfg.Feeds {
			f := &p.cfg.Feeds[i]
			if p.feedHeld(f.Name) {
				fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := d.feedUsable(fctx, p, f)
				cancel()
				if err != nil && ctx.Err() == nil {
					d.log.Warn("held feed's target table not read again", "partner", p.cfg.ID, "feed", f.Name, "err", err)
				}
			}
			d.setHeldGauge(p, f.Name, p.feedHeld(f.Name))
		}
	}
}

// setHeldGauge sets intake_feed_target_held for the feed, unless the
// runtime was replaced or removed: its successor speaks for the partner.
func (d *Daemon) setHeldGauge(p *partnerRT, feed string, held bool) {
	if p.retired() {
		return
	}
	v := 0.0
	if held {
		v = 1
	}
	d.metrics.targetHeld.WithLabelValues(p.cfg.ID, feed).Set(v)
}

// feedHeld reports whether the runtime holds the feed now.
func (p *partnerRT) feedHeld(feed string) bool {
	p.holdMu.Lock()
	defer p.holdMu.Unlock()
	_, held := p.holds[feed]
	return held
}

// setFeedHeld holds the feed for problem (a redacted error), or lets it
// go (problem ""), logging the change and setting
// intake_feed_target_held (a feed neither held nor let go is left to
// recheckHeld's every 15 s: a poll sets no gauge). It reports whether it
// let a hold go.
func (d *Daemon) setFeedHeld(p *partnerRT, f *partners.Feed, problem string) (released bool) {
	now := time.Now()
	p.holdMu.Lock()
	h := p.holds[f.Name]
	switch {
	case problem == "" && h == nil:
		p.holdMu.Unlock()
		return false
	case problem == "":
		delete(p.holds, f.Name)
		p.nHeld.Add(-1)
	case h == nil:
		if p.holds == nil {
			p.holds = map[string]*feedHold{}
		}
		p.holds[f.Name] = &feedHold{problem: problem, since: now, next: now.Add(targetRetry)}
		p.nHeld.Add(1)
	default:
		h.problem, h.next = problem, now.Add(targetRetry)
	}
	p.holdMu.Unlock()
	d.setHeldGauge(p, f.Name, problem != "")
	switch {
	case problem != "" && h == nil:
		d.log.Error("feed held: its target table cannot be written; its files stay in ready/ until it can",
			"partner", p.cfg.ID, "feed", f.Name, "target", f.Target, "reason", string(reason.TargetUnusable), "problem", problem)
	case problem == "" && h != nil:
		d.log.Info("feed's target table can be written again: its files are taken", "partner", p.cfg.ID, "feed", f.Name,
			"target", f.Target, "held_for", now.Sub(h.since).Round(time.Second).String())
		return true
	}
	return false
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
	if r.p != nil && r.p.feedHeld(r.feed.Name) {
		return nil, errFeedHeld
	}
	tgt, err := r.d.targets.Get(ctx, r.feed)
	if err != nil && r.p != nil && unusableTarget(err) {
		r.d.setFeedHeld(r.p, r.feed, pgerr.Redact(err))
		return nil, fmt.Errorf("%w: %w", errFeedHeld, err)
	}
	return tgt, err
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
	if g.p.nHeld.Load() == 0 {
		// every feed of a runtime was loaded or held when it was made
		// (CheckTargets, a reload's checkFeeds): none held, all usable;
		// a table found unusable later is held by the file's run
		// (targetTable)
		return true, nil
	}
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
