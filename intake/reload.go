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
//   - a removed partner's schedule is dropped and its poller ends;
//   - a changed partner (any key differs) is a new partnerRT: the old one
//     retires as a removed one does, and the new one polls only once the
//     old one's poll in progress has ended, taking over what the old one
//     knew (settled, resumed, its last poll's state).
//
// A reload that would leave claims where nothing looks after them is
// refused while they are there (holdNothingLeft): one that removes a
// partner while this worker has claims of it, or moves its processing,
// quarantine or archive dir while claims are left that the old dirs
// must finish.
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
			if had {
				unlock, err := d.holdNothingLeft(ctx, o, &c)
				if err != nil {
					return res, fmt.Errorf("partner %s: %w", c.ID, err)
				}
				// held until the reload is in force (or refused): no poll
				// of the old runtime claims under the old config meanwhile
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
				unlock, err := d.holdNothingLeft(ctx, p, nil)
				if err != nil {
					return res, fmt.Errorf("partner %s: %w", id, err)
				}
				defer unlock() // no poll of the removed runtime claims meanwhile
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

// ErrProcessingInUse: a reload would remove a partner, or move its
// processing, quarantine or archive dir, while claims are left that must
// finish under the config in force.
var ErrProcessingInUse = errors.New("claims are left that must finish under the config in force")

// maxNamedClaims bounds how many claims a refused reload names.
const maxNamedClaims = 10

// pollWait bounds how long a reload waits for a partner's poll in
// progress to end (an idle poll is a listing or two, a small file's a
// second) before it names the poll as left.
const pollWait = 5 * time.Second

// leftScope is what of a partner's claims a reload must find finished
// before it retires the partner's runtime.
type leftScope struct {
	why string // what the reload does to the partner, for the refusal
	// the rows that count: those owning a claimed path below under (any
	// path when ""), held by worker (any worker's when ""), live ones
	// only when live (else awaiting approval too)
	under, worker string
	live          bool
	// list, when not "", is a dir of the site whose entries are claims
	// left; base: it is the processing base, and every worker's dir
	// below it is listed; unlessSettled: it is listed only when the
	// partner is not settled (partnerRT.settled: else nothing of this
	// worker is there without a row)
	list                string
	base, unlessSettled bool
}

// scopeOf is what a reload that retires the runtime of cur for next (nil:
// the partner is removed) must find finished, worker being this daemon's
// worker id; ok is false when nothing need be.
//
//   - a removed partner: this worker's rows of it and, unless the partner
//     is settled, the entries of this worker's processing dir. Another
//     replica still serving the partner looks after its own claims, and
//     never adopts from the dir of a worker that lives: without the check
//     a claim without a row would stay in this worker's dir for good, and
//     a live row would wait for its lease to run out (for good, when no
//     other replica serves the partner);
//   - a processing dir moved: every row with a path below the old one and
//     the entries of every worker's dir there: nothing looks there again;
//   - a quarantine or archive dir moved: every row holding a claim,
//     whoever holds it: any of them may be a hold or an archive that
//     moved its file to the old dir and never recorded its end, and its
//     next run (its owner's, or this daemon's after a takeover) would
//     look for the file in the new dir only.
func scopeOf(cur, next *partners.Config, worker string) (s leftScope, ok bool) {
	l := partners.NewLayout(cur)
	if next == nil {
		s = leftScope{why: "removes the partner", worker: worker}
		if !cur.Records() {
			s.list, s.unlessSettled = l.ProcessingDir(worker), true
		}
		return s, true
	}
	procs, finish := cur.ProcessingMoves(next), cur.FinishDirsMove(next)
	switch {
	case procs && finish:
		s = leftScope{why: "moves the partner's processing dir and its quarantine or archive dir"}
	case procs:
		s = leftScope{why: "moves the partner's processing dir", under: l.ProcessingBase()}
	case finish:
		// only a live row can have moved its file and not recorded it
		return leftScope{why: "moves the partner's quarantine or archive dir", live: true}, true
	default:
		return s, false
	}
	s.list, s.base = l.ProcessingBase(), true
	return s, true
}

// holdNothingLeft makes sure a reload that retires o (a runtime it
// replaces by one for next, or removes: next nil) leaves no claim that
// nothing would look after (scopeOf): no row in the scope, no poll of o
// in progress (one is waited for up to pollWait), and, where the scope
// says, no entry in the processing dirs on the site. It returns with o's
// poll lock held (unlock releases it) so that no poll of o claims under
// the old config before the reload is in force. Anything left is named
// in an ErrProcessingInUse refusal: the operator lets those files finish,
// or be adopted, and reloads again. A listing that finds this worker's
// processing dir empty settles o.
func (d *Daemon) holdNothingLeft(ctx context.Context, o *partnerRT, next *partners.Config) (unlock func(), err error) {
	s, ok := scopeOf(o.cfg, next, d.cfg.WorkerID)
	if !ok {
		return func() {}, nil
	}
	rows := func() ([]string, error) {
		ids, err := d.ledger.Holding(ctx, o.cfg.ID, s.under, s.worker, s.live, maxNamedClaims+1)
		var left []string
		for _, id := range ids {
			left = append(left, fmt.Sprintf("intake %d", id))
		}
		return left, err
	}
	if err := lockIdle(ctx, o); errors.Is(err, errPollBusy) {
		left, err := rows()
		if err != nil {
			return nil, err
		}
		return nil, claimsLeft(s.why, append(left, "a poll in progress"))
	} else if err != nil {
		return nil, err
	}
	// o's poll lock is held: the rows are looked up under it, so no poll
	// adds one after the look; a removal looks in the partner's claim
	// section too, where this worker's reconciler takes files over and
	// adopts them, and marks the partner removing there (Serves), so no
	// file of it comes into this worker's hands after the look either
	var left []string
	var gone []int64
	if next == nil {
		err = d.ledger.InClaimSection(ctx, o.cfg.ID, func(*ledger.ClaimLock) (err error) {
			if left, err = rows(); err == nil && len(left) == 0 {
				o.removing.Store(true)
				// rows whose owner is no live replica: only a reconciler
				// or a poller of the partner takes them over
				gone, err = d.ledger.HeldByGone(ctx, o.cfg.ID, maxNamedClaims+1)
			}
			return err
		})
	} else {
		left, err = rows()
	}
	if err == nil && len(left) == 0 && next == nil {
		left, err = d.goneLeft(ctx, o, gone)
	}
	if err == nil && len(left) == 0 && s.list != "" && !(s.unlessSettled && o.settled && !o.takenOver.Load()) {
		left, err = processingEntries(ctx, d.sessions, o, s.list, s.base)
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("listing %s: %w", s.list, context.Cause(ctx))
		case err != nil && next == nil:
			// a partner removed because its site is gone must go: its dir
			// is looked through by the next start that configures it again
			// (the run is not drained)
			d.log.Warn("partner removed by a reload without looking through its processing dir: its site did not answer; a start with the partner configured again looks there",
				"partner", o.cfg.ID, "dir", s.list, "err", err)
			d.parts.unlooked.Store(true)
			left, err = nil, nil
		case err != nil:
			err = fmt.Errorf("the reload %s: %w: cannot list %s to see that it holds no claim: %w", s.why, ErrProcessingInUse, s.list, err)
		case len(left) == 0:
			o.settled = true // nothing of this worker is there without a row
		}
	}
	if err == nil && len(left) > 0 {
		err = claimsLeft(s.why, left)
	}
	unlock = func() {
		o.removing.Store(false) // removed by now (retired: Serves says no), or kept
		o.mu.Unlock()
	}
	if err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// goneLeft judges what of a partner being removed no live replica holds:
// its rows held by replicas no longer alive (gone), and the entries
// without a row in those replicas' processing dirs (a claim whose row was
// never written, its replica gone before it adopted it; a worker id that
// never registered, a one-shot run's, counts as gone, as its rows do:
// HeldByGone). Only a reconciler or poller of the partner takes them
// over or adopts them, none once every replica has removed it: while its
// site answers they are named, and the removal refused until they are
// (this replica's reconciler included); a site that does not answer takes
// no takeover either, so the partner is removed all the same, with a
// warning naming them: a start with the partner configured again takes
// them over. This worker's own dir is looked through by the caller.
func (d *Daemon) goneLeft(ctx context.Context, o *partnerRT, gone []int64) ([]string, error) {
	layout := partners.NewLayout(o.cfg)
	base := layout.ProcessingBase()
	err := fault.Check("reload:site_probe") // (a test's site that does not answer)
	var paths []string
	if err == nil {
		// every entry: those of live replicas are judged by them
		paths, err = processingPaths(ctx, d.sessions, o, base, true, maxProcessingLook)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("listing %s: %w", base, context.Cause(ctx))
		}
		d.log.Warn("partner removed by a reload without looking at what replicas no longer alive left: its site did not answer, so none can be taken over; a start with the partner configured again takes them over",
			"partner", o.cfg.ID, "intake_ids", gone, "dir", base, "err", err)
		return nil, nil
	}
	left := make([]string, 0, len(gone))
	for _, id := range gone {
		left = append(left, fmt.Sprintf("intake %d (held by a replica no longer alive: a reconciler of the partner takes it over)", id))
	}
	own := layout.ProcessingDir(d.cfg.WorkerID)
	alive := map[string]bool{}
	var theirs []string
	manifests := o.cfg.Readiness == partners.ReadinessManifest
	for _, p := range paths {
		dir := path.Dir(p)
		if dir == own || manifests && strings.HasSuffix(p, partners.ManifestSuffix) {
			// a manifest is adopted with its file, or one beside no
			// file is the reconciler's finding for a human (strayManifest)
			continue
		}
		w := path.Base(dir)
		a, seen := alive[w]
		if !seen {
			if a, err = d.ledger.WorkerAlive(ctx, w); err != nil {
				return nil, err
			}
			alive[w] = a
		}
		if !a {
			theirs = append(theirs, p)
		}
	}
	if len(theirs) == 0 {
		return left, nil
	}
	live, err := d.ledger.LivePaths(ctx, o.cfg.ID, theirs)
	if err != nil {
		return nil, err
	}
	for _, p := range theirs {
		if !live[p] && len(left) <= maxNamedClaims {
			left = append(left, p+" (no row; its replica is no longer alive: a reconciler of the partner adopts it)")
		}
	}
	return left, nil
}

// maxProcessingLook bounds the entries a removal reads from the
// processing dirs of every replica.
const maxProcessingLook = 100000

// errPollBusy: a partner's poll was still in progress after pollWait.
var errPollBusy = errors.New("a poll in progress")

// lockIdle takes o's poll lock once the poll in progress (if any) has
// ended, waiting up to pollWait (errPollBusy) and no longer than ctx.
func lockIdle(ctx context.Context, o *partnerRT) error {
	if o.mu.TryLock() {
		return nil
	}
	giveUp := time.NewTimer(pollWait)
	defer giveUp.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the poll in progress: %w", context.Cause(ctx))
		case <-giveUp.C:
			return errPollBusy
		case <-tick.C:
			if o.mu.TryLock() {
				return nil
			}
		}
	}
}

// processingEntries names the entries of dir on o's site, or with base
// those of every worker's dir below it (none when dir does not exist), at
// most maxNamedClaims+1. A listing the site leaves unanswered ends with
// ctx (a stop signal ends the reload at once, not an op timeout later):
// the partner's session is closed then, and its next poll dials afresh.
func processingEntries(ctx context.Context, k *sessionKeeper, o *partnerRT, dir string, base bool) ([]string, error) {
	paths, err := processingPaths(ctx, k, o, dir, base, maxNamedClaims+1)
	for i := range paths {
		paths[i] += " (no row)"
	}
	return paths, err
}

// processingPaths is processingEntries' paths as they are, at most limit.
func processingPaths(ctx context.Context, k *sessionKeeper, o *partnerRT, dir string, base bool, limit int) ([]string, error) {
	sess, err := k.session(ctx, o)
	if err != nil {
		return nil, err
	}
	defer sess.CloseWhenDone(ctx)()
	dirs := []string{dir}
	if base {
		ents, err := sess.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		dirs = dirs[:0]
		for _, e := range ents {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				dirs = append(dirs, path.Join(dir, e.Name()))
			}
		}
	}
	var left []string
	for _, dir := range dirs {
		ents, err := sess.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			if !base {
				return nil, nil
			}
			continue // a worker's dir gone since the listing of their parent
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			left = append(left, path.Join(dir, e.Name()))
			if len(left) >= limit {
				return left, nil
			}
		}
	}
	return left, nil
}

func claimsLeft(why string, left []string) error {
	more := ""
	if len(left) > maxNamedClaims {
		left, more = left[:maxNamedClaims], " and more"
	}
	return fmt.Errorf("the reload %s: %w: %s%s; the config in force is kept: let those files finish, or the next polls adopt them (intake status), then reload again",
		why, ErrProcessingInUse, strings.Join(left, ", "), more)
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
