package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/intake/targethold"
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
// replica reads a held feed's table again every targethold.Retry (the gauges' loop,
// and a poll that lists a file of it), whether files wait or not, so the
// hold ends by itself once ops fix the table.
//
// Before, one such feed stopped them all: a daemon whose config named it
// did not start, and `intake run --once` polled no partner (CheckTargets
// returned the first error). A reload still refuses a config that would
// hold a feed the config in force writes (targetHolds.checkFeeds): there a
// working mapping is kept; at a start there is none to keep.
//
// A table that breaks after it was loaded (dropped, altered) is met by the
// file's statements: the file ends target_error, which ops replay after
// the fix (docs/failure-matrix.md).

// targetHolds holds and lets go the partners' feeds (each partner's
// targethold.Feeds) and sets intake_feed_target_held.
type targetHolds struct {
	db      *pgxpool.Pool
	targets *target.Cache
	parts   *partnerSet
	held    *prometheus.GaugeVec // intake_feed_target_held
	log     *slog.Logger
}

// usable reports whether the feed's target can be written, loading it
// when it is not yet (a cache hit otherwise). A held feed's table is read
// again only once its retry is due, and a failure to ask the database
// then keeps it held until the next retry. err is a failure to ask the
// database about a feed not held, for the poll to retry.
func (t *targetHolds) usable(ctx context.Context, p *partnerRT, f *partners.Feed) (bool, error) {
	held, due := p.holds.Due(f.Name)
	if !due {
		return false, nil
	}
	_, err := t.targets.Get(ctx, f)
	switch {
	case err == nil:
		if t.set(p, f, "") {
			logFindings(ctx, t.log, target.NewChecker(t.db), p.cfg.ID, f) // as at a start
		}
		return true, nil
	case targethold.Unusable(err):
		t.set(p, f, pgerr.Redact(err))
		return false, nil
	case held && ctx.Err() == nil:
		// held, and the database did not answer this time: held still
		t.log.Warn("held feed's target table not read again; tried at the next retry", "partner", p.cfg.ID, "feed", f.Name,
			"target", f.Target, "err", err)
		p.holds.Later(f.Name)
		return false, nil
	default:
		return false, err
	}
}

// recheck reads the table of every held feed whose retry is due (the
// gauges' loop), files waiting or not, each within 10 s, and sets every
// feed's gauge from what its partner's current runtime holds.
func (t *targetHolds) recheck(ctx context.Context) {
	for _, p := range t.parts.list() {
		for i := range p.cfg.Feeds {
			f := &p.cfg.Feeds[i]
			if p.holds.Held(f.Name) {
				fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := t.usable(fctx, p, f)
				cancel()
				if err != nil && ctx.Err() == nil {
					t.log.Warn("held feed's target table not read again", "partner", p.cfg.ID, "feed", f.Name, "err", err)
				}
			}
			t.setGauge(p, f.Name, p.holds.Held(f.Name))
		}
	}
}

// setGauge sets intake_feed_target_held for the feed, unless the runtime
// was replaced or removed: its successor speaks for the partner.
func (t *targetHolds) setGauge(p *partnerRT, feed string, held bool) {
	if p.retired() {
		return
	}
	v := 0.0
	if held {
		v = 1
	}
	t.held.WithLabelValues(p.cfg.ID, feed).Set(v)
}

// set holds the feed for problem (a redacted error), or lets it go
// (problem ""), logging the change and setting intake_feed_target_held (a
// feed neither held nor let go is left to recheck's every 15 s: a poll
// sets no gauge). It reports whether it let a hold go.
func (t *targetHolds) set(p *partnerRT, f *partners.Feed, problem string) (released bool) {
	change, since := p.holds.Set(f.Name, problem)
	if change == targethold.Unchanged && problem == "" {
		return false
	}
	t.setGauge(p, f.Name, problem != "")
	switch change {
	case targethold.Holds:
		t.log.Error("feed held: its target table cannot be written; its files stay in ready/ until it can",
			"partner", p.cfg.ID, "feed", f.Name, "target", f.Target, "reason", string(partners.SkipTargetUnusable), "problem", problem)
	case targethold.Released:
		t.log.Info("feed's target table can be written again: its files are taken", "partner", p.cfg.ID, "feed", f.Name,
			"target", f.Target, "held_for", time.Since(since).Round(time.Second).String())
		return true
	}
	return false
}

// feeds names the feeds held now, as "partner/feed" in order.
func (t *targetHolds) feeds() []string {
	var out []string
	for _, p := range t.parts.list() {
		for name := range p.holds.Problems() {
			out = append(out, p.cfg.ID+"/"+name)
		}
	}
	sort.Strings(out)
	return out
}

// HeldFeeds names the feeds held now, as "partner/feed" in order: a
// one-shot run that held one ends with code 1 (needs attention).
func (d *Daemon) HeldFeeds() []string { return d.feedHolds.feeds() }

// heldFeed is a feed a reload holds once it is in force, and why.
type heldFeed struct {
	p       *partnerRT
	f       *partners.Feed
	problem string
}

// checkFeeds loads the target table of each of an added or changed
// partner's feeds (p, replacing prev, nil for an added partner). A feed
// whose table cannot be written is returned, to be held; but where the
// config in force writes that feed (prev has it and does not hold it),
// the reload is refused and the working mapping kept.
func (t *targetHolds) checkFeeds(ctx context.Context, p, prev *partnerRT) ([]heldFeed, error) {
	var held []heldFeed
	for i := range p.cfg.Feeds {
		f := &p.cfg.Feeds[i]
		_, err := t.targets.Get(ctx, f)
		switch {
		case err == nil:
			continue
		case !targethold.Unusable(err):
			return nil, fmt.Errorf("partner %s feed %s: %w", p.cfg.ID, f.Name, err)
		case prev != nil && prev.writes(f.Name):
			return nil, fmt.Errorf("partner %s feed %s: %w (the feed in force is kept)", p.cfg.ID, f.Name, err)
		}
		held = append(held, heldFeed{p: p, f: f, problem: pgerr.Redact(err)})
	}
	return held, nil
}

// writes reports whether the runtime has a feed of that name that is not
// held.
func (p *partnerRT) writes(feed string) bool {
	held := p.holds.Held(feed)
	for _, f := range p.cfg.Feeds {
		if f.Name == feed {
			return !held
		}
	}
	return false
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
	if r.p != nil && r.p.holds.Held(r.feed.Name) {
		return nil, errFeedHeld
	}
	tgt, err := r.d.targets.Get(ctx, r.feed)
	if err != nil && r.p != nil && targethold.Unusable(err) {
		r.d.feedHolds.set(r.p, r.feed, pgerr.Redact(err))
		return nil, fmt.Errorf("%w: %w", errFeedHeld, err)
	}
	return tgt, err
}

// feedGate answers, for one poll's listing, whether a feed's files may be
// claimed: each feed is asked once per poll (targetHolds.usable).
type feedGate struct {
	h     *targetHolds
	p     *partnerRT
	known map[*partners.Feed]bool
}

func (t *targetHolds) gate(p *partnerRT) *feedGate {
	return &feedGate{h: t, p: p, known: map[*partners.Feed]bool{}}
}

func (g *feedGate) usable(ctx context.Context, f *partners.Feed) (bool, error) {
	if !g.p.holds.Any() {
		// every feed of a runtime was loaded or held when it was made
		// (CheckTargets, a reload's checkFeeds): none held, all usable;
		// a table found unusable later is held by the file's run
		// (targetTable)
		return true, nil
	}
	if ok, seen := g.known[f]; seen {
		return ok, nil
	}
	ok, err := g.h.usable(ctx, g.p, f)
	if err != nil {
		return false, err
	}
	g.known[f] = ok
	return ok, nil
}
