package targethold

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/reason"
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
// replica reads a held feed's table again every Retry (the gauges' loop,
// and a poll that lists a file of it), whether files wait or not, so the
// hold ends by itself once ops fix the table.
//
// Before, one such feed stopped them all: a daemon whose config named it
// did not start, and `intake run --once` polled no partner (CheckTargets
// returned the first error). A reload still refuses a config that would
// hold a feed the config in force writes (Keeper.CheckFeeds): there a
// working mapping is kept; at a start there is none to keep.
//
// A table that breaks after it was loaded (dropped, altered) is met by the
// file's statements: the file ends target_error, which ops replay after
// the fix (docs/failure-matrix.md).

// A Partner is a partner's runtime as the holds see it.
type Partner interface {
	Config() *partners.Config
	Holds() *Feeds
	// Retired: a reload replaced or removed the runtime; its successor
	// speaks for the partner.
	Retired() bool
}

// Keeper holds and lets go the partners' feeds (each partner's Feeds)
// and sets intake_feed_target_held.
type Keeper struct {
	DB       *pgxpool.Pool
	Targets  *target.Cache
	Partners func() []Partner     // the current runtimes
	Held     *prometheus.GaugeVec // intake_feed_target_held, by partner and feed
	Log      *slog.Logger
}

// Check loads every feed's target table; a feed whose table cannot be
// written is held (logged, intake_feed_target_held 1, its files left in
// ready/) and the rest go on. It then compares each loaded feed's columns
// with its target's and logs the findings (LogFindings); these do not
// stop the daemon. Its error is a failure to ask the database.
func (k *Keeper) Check(ctx context.Context) error {
	chk := target.NewChecker(k.DB) // each table's catalog read once, whatever the partners writing it
	for _, p := range k.Partners() {
		c := p.Config()
		for i := range c.Feeds {
			f := &c.Feeds[i]
			ok, err := k.Usable(ctx, p, f)
			if err != nil {
				return fmt.Errorf("partner %s feed %s: %w", c.ID, f.Name, err)
			}
			if ok {
				LogFindings(ctx, k.Log, chk, c.ID, f)
			}
		}
	}
	return nil
}

// LogFindings compares a loaded feed's columns with its target's
// (target.Checker) and logs what the target could refuse as errors, what
// cannot be decided as warnings: a refused value is met per row at run
// time, and `intake check` is the gate that fails on them.
func LogFindings(ctx context.Context, log *slog.Logger, chk *target.Checker, partner string, f *partners.Feed) {
	findings, err := chk.Compare(ctx, partner, f)
	if err != nil {
		log.Warn("target not compared with the feed", "partner", partner, "feed", f.Name, "target", f.Target, "err", err)
		return
	}
	for _, g := range findings {
		if g.Fail {
			log.Error("target may refuse values the feed accepts (intake check fails)", "partner", partner, "feed", f.Name,
				"target", f.Target, "column", g.Column, "problem", g.Detail)
		} else {
			log.Warn("target constraint not decidable from the declarations", "partner", partner, "feed", f.Name,
				"target", f.Target, "column", g.Column, "problem", g.Detail)
		}
	}
}

// Usable reports whether the feed's target can be written, loading it
// when it is not yet (a cache hit otherwise). A held feed's table is read
// again only once its retry is due, and a failure to ask the database
// then keeps it held until the next retry. err is a failure to ask the
// database about a feed not held, for the poll to retry.
func (k *Keeper) Usable(ctx context.Context, p Partner, f *partners.Feed) (bool, error) {
	c := p.Config()
	held, due := p.Holds().Due(f.Name)
	if !due {
		return false, nil
	}
	_, err := k.Targets.Get(ctx, f)
	switch {
	case err == nil:
		if k.Set(p, f, "") {
			LogFindings(ctx, k.Log, target.NewChecker(k.DB), c.ID, f) // as at a start
		}
		return true, nil
	case Unusable(err):
		k.Set(p, f, pgerr.Redact(err))
		return false, nil
	case held && ctx.Err() == nil:
		// held, and the database did not answer this time: held still
		k.Log.Warn("held feed's target table not read again; tried at the next retry", "partner", c.ID, "feed", f.Name,
			"target", f.Target, "err", err)
		p.Holds().Later(f.Name)
		return false, nil
	default:
		return false, err
	}
}

// Recheck reads the table of every held feed whose retry is due (the
// gauges' loop), files waiting or not, each within 10 s, and sets every
// feed's gauge from what its partner's current runtime holds.
func (k *Keeper) Recheck(ctx context.Context) {
	for _, p := range k.Partners() {
		c := p.Config()
		for i := range c.Feeds {
			f := &c.Feeds[i]
			if p.Holds().Held(f.Name) {
				fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := k.Usable(fctx, p, f)
				cancel()
				if err != nil && ctx.Err() == nil {
					k.Log.Warn("held feed's target table not read again", "partner", c.ID, "feed", f.Name, "err", err)
				}
			}
			k.setGauge(p, f.Name, p.Holds().Held(f.Name))
		}
	}
}

// setGauge sets intake_feed_target_held for the feed, unless the runtime
// was replaced or removed: its successor speaks for the partner. A feed
// not held has no series (absent reads as 0: a fleet's feeds would each
// keep one at 0).
func (k *Keeper) setGauge(p Partner, feed string, held bool) {
	if p.Retired() {
		return
	}
	if !held {
		k.Held.DeleteLabelValues(p.Config().ID, feed)
		return
	}
	k.Held.WithLabelValues(p.Config().ID, feed).Set(1)
}

// Set holds the feed for problem (a redacted error), or lets it go
// (problem ""), logging the change and setting intake_feed_target_held (a
// feed neither held nor let go is left to Recheck's every 15 s: a poll
// sets no gauge). It reports whether it let a hold go.
func (k *Keeper) Set(p Partner, f *partners.Feed, problem string) (released bool) {
	c := p.Config()
	change, since := p.Holds().Set(f.Name, problem)
	if change == Unchanged && problem == "" {
		return false
	}
	k.setGauge(p, f.Name, problem != "")
	switch change {
	case Holds:
		k.Log.Error("feed held: its target table cannot be written; its files stay in ready/ until it can",
			"partner", c.ID, "feed", f.Name, "target", f.Target, "reason", string(reason.TargetUnusable), "problem", problem)
	case Released:
		k.Log.Info("feed's target table can be written again: its files are taken", "partner", c.ID, "feed", f.Name,
			"target", f.Target, "held_for", time.Since(since).Round(time.Second).String())
		return true
	}
	return false
}

// Names names the feeds held now, as "partner/feed" in order.
func (k *Keeper) Names() []string {
	var out []string
	for _, p := range k.Partners() {
		for name := range p.Holds().Problems() {
			out = append(out, p.Config().ID+"/"+name)
		}
	}
	sort.Strings(out)
	return out
}

// Pending is a feed a reload holds once it is in force, and why.
type Pending struct {
	P       Partner
	F       *partners.Feed
	Problem string
}

// CheckFeeds loads the target table of each of an added or changed
// partner's feeds (p, replacing prev, nil for an added partner). A feed
// whose table cannot be written is returned, to be held (Set); but where
// the config in force writes that feed (prev has it and does not hold
// it), the reload is refused and the working mapping kept.
func (k *Keeper) CheckFeeds(ctx context.Context, p, prev Partner) ([]Pending, error) {
	var held []Pending
	c := p.Config()
	for i := range c.Feeds {
		f := &c.Feeds[i]
		_, err := k.Targets.Get(ctx, f)
		switch {
		case err == nil:
			continue
		case !Unusable(err):
			return nil, fmt.Errorf("partner %s feed %s: %w", c.ID, f.Name, err)
		case prev != nil && writes(prev, f.Name):
			return nil, fmt.Errorf("partner %s feed %s: %w (the feed in force is kept)", c.ID, f.Name, err)
		}
		held = append(held, Pending{P: p, F: f, Problem: pgerr.Redact(err)})
	}
	return held, nil
}

// writes reports whether the runtime has a feed of that name that is not
// held.
func writes(p Partner, feed string) bool {
	held := p.Holds().Held(feed)
	for _, f := range p.Config().Feeds {
		if f.Name == feed {
			return !held
		}
	}
	return false
}

// Gate answers, for one poll's listing, whether a feed's files may be
// claimed: each feed is asked once per poll (Usable).
type Gate struct {
	k     *Keeper
	p     Partner
	known map[*partners.Feed]bool
}

// Gate is a gate for one poll of p.
func (k *Keeper) Gate(p Partner) *Gate {
	return &Gate{k: k, p: p, known: map[*partners.Feed]bool{}}
}

// Usable reports whether f's files may be claimed in this poll.
func (g *Gate) Usable(ctx context.Context, f *partners.Feed) (bool, error) {
	if !g.p.Holds().Any() {
		// every feed of a runtime was loaded or held when it was made
		// (Check, a reload's CheckFeeds): none held, all usable; a table
		// found unusable later is held by the file's run (the pipeline's
		// targetTable)
		return true, nil
	}
	if ok, seen := g.known[f]; seen {
		return ok, nil
	}
	ok, err := g.k.Usable(ctx, g.p, f)
	if err != nil {
		return false, err
	}
	g.known[f] = ok
	return ok, nil
}
