package intake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"reflect"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// Reloading the partners of a running daemon (SIGHUP).
//
// The partner set (Daemon.parts, partnerset.go) is copied on write: a
// reload builds a new set and swaps it in under its lock; readers that
// run beside a reload (gauges, /readyz, the heartbeat, Poke) take a
// snapshot with its list, ids or get. A reload takes effect at each
// partner's next poll: a poll in progress, with its claims and the files it
// carries, finishes under the configuration it started with, so a file in
// flight keeps the mapping it was planned with.
//
//   - an added partner gets its schedule and poller at once and is polled;
//   - a removed partner's schedule is dropped and its poller ends after
//     the poll in progress (its files in flight finish);
//   - a changed partner (any key differs) is a new partnerRT: the old one
//     retires as a removed one does, and the new one polls only once the
//     old one's poll in progress has ended, taking over what the old one
//     knew (settled, resumed, its last poll's state).
//
// Daemon-wide settings (worker id, lease, drain, database, spool) are not
// the daemon's to reload: the caller keeps them until a restart.

// ErrNotRunning: a reload needs a started daemon that is not stopping.
var ErrNotRunning = errors.New("intake: the daemon is not running")

// ReloadResult names the partners a reload added, removed and changed.
type ReloadResult struct {
	Added, Removed, Changed []string
}

// Changes reports whether the reload changed anything.
func (r ReloadResult) Changes() bool {
	return len(r.Added)+len(r.Removed)+len(r.Changed) > 0
}

// Reload makes parts (validated, as config.Load does) the daemon's
// partners. Every target table of an added or changed partner's feeds is
// checked first (targethold.Keeper.CheckFeeds): a feed whose table cannot be written is
// held once the reload is in force, unless the config in force writes
// that feed; then, as on any other error, nothing changes.
func (d *Daemon) Reload(ctx context.Context, parts []partners.Config) (ReloadResult, error) {
	d.mu.Lock() // no Start or Stop meanwhile; Stop halts under d.mu
	defer d.mu.Unlock()
	var res ReloadResult
	if !d.life.Running() {
		return res, ErrNotRunning
	}
	d.parts.mu.RLock()
	old := d.parts.byID
	d.parts.mu.RUnlock()
	next := map[string]*partnerRT{}
	var order []string
	var fresh []*partnerRT        // added or changed: to be started
	var held []targethold.Pending // their feeds to hold once the reload is in force
	for i := range parts {
		c := parts[i] // a copy of its own: the old runtime keeps pointing at the old config
		if _, dup := next[c.ID]; dup {
			return res, fmt.Errorf("partner %s configured twice", c.ID)
		}
		o, had := old[c.ID]
		if had && reflect.DeepEqual(*o.cfg, c) {
			next[c.ID] = o
		} else {
			if had && o.cfg.ProcessingMoves(&c) {
				unlock, err := holdEmptyProcessing(ctx, d.ledger, d.sessions, o)
				if err != nil {
					return res, fmt.Errorf("partner %s: %w", c.ID, err)
				}
				// held until the reload is in force (or refused): no poll
				// of the old runtime claims into the old dir meanwhile
				defer unlock()
			}
			if err := unwrap.CheckPGPKeys(&c); err != nil {
				return res, err
			}
			p := d.sessions.newPartnerRT(&c)
			h, err := d.feedHolds.CheckFeeds(ctx, p, partnerOrNil(o))
			if err != nil {
				return res, err
			}
			held = append(held, h...)
			next[c.ID] = p
			fresh = append(fresh, p)
			if had {
				res.Changed = append(res.Changed, c.ID)
			} else {
				res.Added = append(res.Added, c.ID)
			}
		}
		order = append(order, c.ID)
	}
	var retired []*partnerRT
	for _, id := range d.parts.order {
		if p := old[id]; next[id] != p {
			retired = append(retired, p)
			if _, kept := next[id]; !kept {
				res.Removed = append(res.Removed, id)
			}
		}
	}
	if err := fault.Check("reload:in_force"); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		// a stop came while the reload ran (whether or not a step of it
		// waited on ctx): nothing of it comes into force
		return res, err
	}
	d.parts.mu.Lock()
	d.parts.byID, d.parts.order = next, order
	d.parts.retiring = append(d.parts.retiring, retired...)
	d.parts.mu.Unlock()

	for _, p := range retired {
		d.cron.Remove(p.cronID)
		close(p.quit) // its poller ends after the poll in progress
	}
	for _, p := range fresh { // a changed partner's feeds may differ from its predecessor's (targethold.Keeper.Recheck sets them again)
		d.metrics.TargetHeld.DeletePartialMatch(prometheus.Labels{"partner": p.cfg.ID})
		d.sessions.inForce(p)
	}
	for _, h := range held {
		d.feedHolds.Set(h.P, h.F, h.Problem)
	}
	now := time.Now()
	for _, p := range fresh {
		// the same phase as at a start (sessions.go)
		first, err := schedulePoll(d.cron, p, now, len(order), d.cfg.PollStagger)
		if err != nil { // validated by the caller; a partner without a schedule is still polled once
			d.log.Error("partner's poll schedule refused", "partner", p.cfg.ID, "poll", p.cfg.Poll, "err", err)
		}
		prev := old[p.cfg.ID] // nil for an added partner
		ctx := d.runCtx
		d.life.Go(func() {
			if prev != nil {
				p.takeOver(prev)
			}
			d.loop(ctx, p, first)
		})
	}
	return res, nil
}

// ErrProcessingInUse: a reload would move a partner's processing dir while
// claims are left in the old one.
var ErrProcessingInUse = errors.New("the reload moves the partner's processing dir, which still holds claims")

// maxNamedClaims bounds how many claims a refused reload names.
const maxNamedClaims = 10

// holdEmptyProcessing makes sure the processing dir of o (a runtime a
// reload replaces by one with another processing dir) holds no claim: no
// row of the partner owns a path below it, no poll of o is in progress,
// and a listing of the site finds no entry in any worker's dir there.
// It returns with o's poll lock held (unlock releases it) so that no poll
// of o claims into the old dir before the reload is in force. Anything
// left is named in an ErrProcessingInUse refusal: the operator lets those
// files finish, or be adopted, and reloads again.
func holdEmptyProcessing(ctx context.Context, l *ledger.Ledger, k *sessionKeeper, o *partnerRT) (unlock func(), err error) {
	base := partners.NewLayout(o.cfg).ProcessingBase()
	ids, err := l.HoldingUnder(ctx, o.cfg.ID, base, maxNamedClaims+1)
	if err != nil {
		return nil, err
	}
	var left []string
	for _, id := range ids {
		left = append(left, fmt.Sprintf("intake %d", id))
	}
	if !o.mu.TryLock() {
		return nil, claimsLeft(base, append(left, "a poll in progress"))
	}
	if len(left) == 0 {
		left, err = processingEntries(ctx, k, o, base)
	}
	if err != nil || len(left) > 0 {
		o.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("listing %s: %w", base, context.Cause(ctx))
		case err != nil:
			return nil, fmt.Errorf("%w: cannot list %s to see that it is empty: %w", ErrProcessingInUse, base, err)
		}
		return nil, claimsLeft(base, left)
	}
	return o.mu.Unlock, nil
}

// processingEntries names the entries of every worker's dir below base on
// o's site (none when base does not exist), at most maxNamedClaims+1. A
// listing the site leaves unanswered ends with ctx (a stop signal ends the
// reload at once, not an op timeout later): the partner's session is
// closed then, and its next poll dials afresh.
func processingEntries(ctx context.Context, k *sessionKeeper, o *partnerRT, base string) ([]string, error) {
	sess, err := k.session(ctx, o)
	if err != nil {
		return nil, err
	}
	defer sess.CloseWhenDone(ctx)()
	dirs, err := sess.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var left []string
	for _, dir := range dirs {
		if !dir.IsDir() || strings.HasPrefix(dir.Name(), ".") {
			continue
		}
		ents, err := sess.ReadDir(path.Join(base, dir.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			left = append(left, path.Join(base, dir.Name(), e.Name())+" (no row)")
			if len(left) > maxNamedClaims {
				return left, nil
			}
		}
	}
	return left, nil
}

func claimsLeft(base string, left []string) error {
	more := ""
	if len(left) > maxNamedClaims {
		left, more = left[:maxNamedClaims], " and more"
	}
	return fmt.Errorf("%w: %s holds %s%s; the config in force is kept: let those files finish, or the next polls adopt them (intake status), then reload again",
		ErrProcessingInUse, base, strings.Join(left, ", "), more)
}

// takeOver waits for the poll in progress of the runtime p replaces, then
// carries over what that one knew of the partner's site.
func (p *partnerRT) takeOver(prev *partnerRT) {
	prev.mu.Lock()
	defer prev.mu.Unlock()
	p.mu.Lock()
	p.tempClean, p.resumed, p.settled, p.orphanSweep = prev.tempClean, prev.resumed, prev.settled, prev.orphanSweep
	if prev.cfg.ProcessingMoves(p.cfg) {
		// the new processing dir was never looked through by this
		// runtime: its first poll lists its own dir and sweeps the
		// other workers' there
		p.settled, p.orphanSweep = false, time.Time{}
	}
	p.mu.Unlock()
	prev.statMu.Lock()
	up, lastOK, lastErr, polling, elsewhere := prev.up, prev.lastOK, prev.lastErr, prev.polling, prev.elsewhere
	prev.statMu.Unlock()
	p.statMu.Lock()
	p.up, p.lastOK, p.lastErr, p.polling, p.elsewhere = up, lastOK, lastErr, polling, elsewhere
	p.statMu.Unlock()
}

// retired reports whether a reload removed or replaced the partner's
// runtime; its poller then ends (checked with p.mu held, so no poll of
// it starts after its successor has taken over).
func (p *partnerRT) retired() bool {
	select {
	case <-p.quit:
		return true
	default:
		return false
	}
}
