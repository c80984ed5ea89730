package intake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/backpressure"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/readylist"
	"github.com/partner-intake/partner-intake/intake/slots"
	"github.com/partner-intake/partner-intake/intake/workerid"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// errNotOwner: another live replica polls the partner (affinity.go).
var errNotOwner = errors.New("another replica polls this partner")

// claimTargetBusy: a claim's target name is still in our processing dir
// (counted as skipped).
const claimTargetBusy = "claim_target_busy"

// claimRefused: the site refused a claim's RENAME of the entry (counted
// as skipped: claimStage.claimRefused).
const claimRefused = "claim_refused"

// candidate is an entry of ready/ worth claiming (partners/ready.go).
type candidate = partners.Candidate

// A poll's two stages over the partner's site, each a type over the
// daemon: housekeeping (this worker's own files resumed, crash leftovers
// adopted) and the claim (ready/ listed, its files claimed and run).
type (
	housekeeping struct{ *Daemon }
	claimStage   struct{ *Daemon }
)

// pollOnce is one cycle for one partner: the gate (does this replica poll
// the partner now?), housekeeping (crash leftovers, this worker's own
// files resumed), then the claim loop over what ready/ offers.
func (d *Daemon) pollOnce(ctx context.Context, p *partnerRT) error {
	if !d.claiming() {
		return nil
	}
	// The poll runs under the worker id's hold now: it takes no file as
	// this worker's once that hold ended (intake/workerid, StillHeld).
	h := d.workerID.Current()
	if h == nil || d.workerID.Awaiting() {
		return errWorkerIDNotHeld
	}
	ctx = workerid.WithHold(ctx, h)
	own, err := d.gate(ctx, p)
	if err != nil {
		return err
	}
	d.metrics.Polls.WithLabelValues(p.cfg.ID).Inc()
	// The rows this worker holds of the partner are looked up beside the
	// session's dial (or its reuse) and the housekeeping's listings; the
	// housekeeping uses the answer unless it recorded a claim since
	// (resumeRows; docs/performance.md). A partner this worker holds
	// nothing of, as proven by the last look-up and every poll since
	// (ownsNothing), is not looked up again: an idle fleet's poll makes no
	// statement. Every maxSkippedLookups-th poll looks up anyway.
	var due *background[ownedRows]
	if p.ownsNothing && p.settled && p.lookupsSkipped < maxSkippedLookups {
		p.lookupsSkipped++
		due = resolved(ownedRows{})
	} else {
		p.ownsNothing, p.lookupsSkipped = false, 0
		hk := &housekeeping{d}
		due = inBackground(func() (ownedRows, error) { return hk.lookUpOwned(ctx, p.cfg.ID) })
	}
	defer due.wait()
	sess, err := d.sessions.session(ctx, p)
	if err != nil {
		return err
	}
	// pkg/sftp calls take no context: closing the session is how a
	// shutdown interrupts a transfer in flight.
	stop := context.AfterFunc(ctx, func() { p.drop() })
	defer stop()
	// ready/ is listed beside the housekeeping (their round trips
	// overlap). Records are looked up against the rows the housekeeping
	// resumes, so they are listed after it.
	var ready *background[listing]
	if own && !p.cfg.Records() {
		ready = (&claimStage{d}).listAhead(ctx, p, sess)
		defer ready.wait()
	}
	// The files the housekeeping resumes run in the partner's slots, as
	// the claimed ones do: one that takes long (its rows waiting behind
	// the application's locks) holds one slot, and the claims go on in
	// the others. The poll ends when they all have.
	pool := slots.New(ctx, p.concurrency())
	start := time.Now()
	err = (&housekeeping{d}).housekeep(ctx, p, sess, due, pool)
	d.log.Debug("housekeeping done", "partner", p.cfg.ID, "seconds", time.Since(start).Seconds())
	switch {
	case err != nil:
	case !own:
		err = errNotOwner
	default:
		err = (&claimStage{d}).claimReady(ctx, p, sess, ready, pool)
	}
	// the first error that ends the poll (a resumed run's before
	// errNotOwner: the partner is unsettled by it), else ctx's
	if werr := pool.Wait(); werr != nil && (err == nil || errors.Is(err, errNotOwner)) {
		err = werr
	}
	if err == nil {
		err = ctx.Err()
	}
	if !own {
		p.drop() // the session is the owner's to keep
		p.notPolling(d.metrics)
	}
	return err
}

// ownedRows is the look-up of the rows this worker holds of a partner
// (ledger.DueOwnedBy): the live ones due, and how many it holds, live or
// waiting for a decision of ops.
type ownedRows struct {
	due  []*ledger.Intake
	held int
}

func (d *housekeeping) lookUpOwned(ctx context.Context, partner string) (ownedRows, error) {
	d.signals.OwnedLookup.Signal(partner)
	due, held, err := d.ledger.DueOwnedBy(ctx, partner, d.cfg.WorkerID)
	return ownedRows{due: due, held: held}, err
}

// maxSkippedLookups: a partner this worker holds nothing of is looked up
// again at least every this many polls (a row made another way than by
// its own polls, which is not expected, waits that long at most).
const maxSkippedLookups = 9

// listing is what list keeps of ready/.
type listing struct {
	cands   []candidate
	hostile []partners.Skipped
	beyond  int
}

// listAhead lists ready/ (list) in the background.
func (d *claimStage) listAhead(ctx context.Context, p *partnerRT, sess *sftpconn.Session) *background[listing] {
	return inBackground(func() (listing, error) {
		var l listing
		var err error
		l.cands, l.hostile, l.beyond, err = d.list(ctx, p, sess)
		return l, err
	})
}

// gate decides how this poll goes: whether this replica polls the partner
// (own), or only resumes its own files of it (once after a start, and
// again while the partner is unsettled), or leaves it alone (errNotOwner).
func (d *Daemon) gate(ctx context.Context, p *partnerRT) (own bool, err error) {
	// With several replicas, one polls the partner (affinity.go). The
	// others still resume their own files of it once after they start (a
	// restart's leftovers), then leave it alone.
	own = d.peers.Owns(ctx, p.cfg.ID)
	hinted := p.takenOver.Swap(false)
	if hinted {
		// our reconciler gave us a file of the partner to run, or left
		// one in our processing/ without a row: resume, and look there
		p.resumed, p.settled = false, false
	}
	if !own && !p.resumed && d.replica.prevDrained && !hinted {
		// nothing can be half claimed; resume only if rows say so
		live, err := d.ledger.LiveOwnedBy(ctx, p.cfg.ID, d.cfg.WorkerID)
		if err != nil {
			return false, err
		}
		p.resumed = len(live) == 0
	}
	if !own && p.resumed && p.settled {
		// Left alone only once nothing of this worker can wait in its
		// processing dir without a row: a poll of ours that failed (it may
		// have claimed, then lost the INSERT) leaves the partner unsettled,
		// and no other replica adopts from a live worker's dir, so this
		// one looks there again whoever polls the partner now.
		p.drop() // a session of an earlier poll is the owner's business now
		p.notPolling(d.metrics)
		return false, errNotOwner
	}
	if own {
		p.statMu.Lock()
		p.polling, p.elsewhere = true, false
		p.statMu.Unlock()
	}
	return own, nil
}

// housekeep clears what a crash left of this worker for the partner (spool
// temp files, once) and resumes this worker's own files of it (resumeOwn;
// due: the look-up of its rows started with the poll).
func (d *housekeeping) housekeep(ctx context.Context, p *partnerRT, sess *sftpconn.Session, due *background[ownedRows], pool *slots.Pool) error {
	p.resumedNames, p.resumedBytes = nil, 0
	if !p.tempClean {
		// No download of this worker is in flight for the partner yet: any
		// temp file of ours is a crash's leftover (matrix row 4).
		n, err := d.spool.ClearOwnTemp(p.cfg.ID)
		if err != nil {
			return err
		}
		if n > 0 {
			d.log.Info("removed spool temp files left by a crash", "partner", p.cfg.ID, "files", n)
		}
		p.tempClean = true
	}
	if err := d.resumeOwn(ctx, p, sess, due, pool); err != nil {
		return err
	}
	p.resumed = true
	p.statMu.Lock()
	polling := p.polling
	p.statMu.Unlock()
	if polling && p.cfg.HasApproval() {
		// files ops approved or rejected whose owner has not resumed them
		// (a partner without a policy pays nothing for this; a decided
		// file is still taken over by the reconciler then)
		return d.resumeDecided(ctx, p, sess, pool)
	}
	return nil
}

// claimReady lists ready/, moves its hostile entries to quarantine and
// claims the rest (claimLoop).
func (d *claimStage) claimReady(ctx context.Context, p *partnerRT, sess *sftpconn.Session, ready *background[listing], pool *slots.Pool) error {
	start := time.Now()
	var l listing
	var err error
	if ready != nil {
		l, err = ready.wait()
	} else {
		l.cands, l.hostile, l.beyond, err = d.list(ctx, p, sess)
	}
	if err != nil {
		return err
	}
	// the listings went out behind the site's preparation; nothing is
	// claimed on a site it failed on (sftpconn.ErrNotPrepared)
	if err := sess.Prepared(); err != nil {
		return err
	}
	cands, hostile, beyond := l.cands, l.hostile, l.beyond
	if len(cands) > 0 || len(hostile) > 0 {
		p.ownsNothing = false // this poll may claim: the next one looks up
	}
	d.log.Debug("ready listed", "partner", p.cfg.ID, "candidates", len(cands), "hostile", len(hostile), "beyond", beyond, "waited_seconds", time.Since(start).Seconds())
	// Hostile entries (at most hostileBudget, the oldest) go to quarantine
	// first; each counts against max_files_per_poll like a claim, and is
	// one of the partner's files in flight: it holds a slot of the pool
	// while it moves (here, one after another), beside the files resumed.
	handled := 0
	for _, h := range hostile {
		if ctx.Err() != nil || !d.claiming() || pool.Failed() {
			return ctx.Err()
		}
		slot := d.startSlot(pool)
		if slot == nil {
			return nil
		}
		if ctx.Err() != nil || pool.Failed() {
			slot(nil)
			return ctx.Err()
		}
		err := d.quarantineHostile(ctx, p, sess, h)
		slot(nil)
		if err != nil {
			return err
		}
		handled++
	}
	// a file of a name the housekeeping resumed in this poll waits for the
	// next: claimed beside it, it would land at the path that run archives
	// from (runResumed)
	kept := cands[:0:0]
	for _, c := range cands {
		if p.resumedNames[p.nameKey(c.Name)] {
			d.metrics.Skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
			beyond++
			continue
		}
		kept = append(kept, c)
	}
	cands = kept
	quota, err := d.space.Quota(p.cfg.ID, p.cfg.Limits.MaxSpoolBytes, &p.quotaFull)
	if err != nil {
		return err
	}
	quota.Claimed(p.resumedBytes)
	c := &claimLoop{d: d, p: p, sess: sess, pool: pool, quota: quota, claimed: handled}
	c.run(ctx, cands, beyond)
	return nil
}

// claimLoop is one poll's claims: the candidates of ready/, oldest first,
// each claimed when a slot of the partner's pool is free and run there.
type claimLoop struct {
	d       *claimStage
	p       *partnerRT
	sess    *sftpconn.Session
	pool    *slots.Pool // the poll's, shared with the files it resumed
	quota   *backpressure.Quota
	claimed int  // files claimed or quarantined this poll
	racing  bool // another replica claims from the partner: groups rename one at a time (claim)
}

// run claims and runs the candidates. Up to cfg.Concurrency files of the
// partner are in flight at once, on the one session (pkg/sftp multiplexes
// requests); a group of small files (group.go) takes one slot. A file or
// group is claimed only when a slot is free, so claims never run ahead of
// the work and other replicas can take what this one has not started.
//
// A file's failure is the file's (runAlone settles it); an error that
// ends the poll (a claim's, or a run that could not settle its file) is
// the pool's: it stops further claims, and the files in flight finish.
func (c *claimLoop) run(ctx context.Context, cands []candidate, beyond int) {
	for i := 0; i < len(cands); {
		c.p.setReady(cands[i:], beyond) // what is left for a later poll (or another worker)
		if ctx.Err() != nil || !c.d.claiming() || c.pool.Failed() || !c.room(ctx) {
			break
		}
		slot := c.d.startSlot(c.pool)
		if slot == nil {
			break
		}
		if ctx.Err() != nil {
			slot(nil)
			break
		}
		walked, work, err := c.claimAt(ctx, cands[i:])
		if err != nil {
			slot(func() error { return err }) // the poll's error, recorded at once
			if work != nil {
				c.pool.Run(work) // what the claim did claim still runs (in the slot just given back)
			}
			break
		}
		slot(work) // nil: nothing was claimed, the slot is free again
		i += walked
	}
}

// startSlot waits for a free slot of pool and returns it, or nil when a
// drain began meanwhile (Stop; the slot given back): a poll waiting for a
// slot when the drain begins starts nothing more, no claim, quarantine,
// resume or takeover, and the drain waits only for the files in flight.
func (d *Daemon) startSlot(pool *slots.Pool) func(func() error) {
	slot := pool.TryTake()
	if slot == nil {
		d.signals.SlotWait.Signal(struct{}{})
		slot = pool.Take()
	}
	if !d.claiming() {
		slot(nil)
		return nil
	}
	return slot
}

// room reports whether this poll may claim more: within
// max_files_per_poll, the partner's spool quota and the spool's free
// space, and while this replica polls the partner.
func (c *claimLoop) room(ctx context.Context) bool {
	return c.claimed < c.p.cfg.Limits.MaxFilesPerPoll && c.quota.OK() && c.d.space.SpaceOK() && c.d.peers.Owns(ctx, c.p.cfg.ID)
}

// claimAt claims what starts at cands[0], a group of small files
// (group.go) or one file. It returns how many candidates it went through,
// the work to run in the slot (nil when nothing was claimed), and an
// error that ends the poll.
func (c *claimLoop) claimAt(ctx context.Context, cands []candidate) (walked int, work func() error, err error) {
	d, p, sess := c.d, c.p, c.sess
	if g := groupAt(p.cfg, cands, p.cfg.Limits.MaxFilesPerPoll-c.claimed, p.nocase.Load()); g != nil {
		// small files go through together (group.go), and the groups
		// that follow while slots are free for them are claimed with this
		// one: one claim section, one round trip of renames, for all
		groups, slotsFor := c.followingGroups(cands, g)
		all := g
		if len(groups) > 1 {
			all = nil
			for _, g := range groups {
				all = append(all, g...)
			}
		}
		cl, cerr := d.claim(ctx, p, sess, all, c.racing)
		c.racing = c.racing || cl.raced
		// walked 0: the groups were put back, walk them again one at a time
		c.claimed += len(cl.ins)
		for _, in := range cl.ins {
			c.quota.Claimed(in.ListedSize)
		}
		for k, ins := range splitClaims(groups, cl.ins) {
			var w func() error
			if len(ins) > 0 {
				w = func() error { return d.runGroup(ctx, p, sess, ins) }
			}
			if k == 0 {
				work = w
			} else {
				slotsFor[k-1](w) // nil gives the slot back
			}
		}
		return cl.walked, work, cerr
	}
	if !p.cfg.Records() && cands[0].Size <= p.cfg.Limits.MaxFileBytes {
		startRanges(sess, cands[0].Size) // beside the claim (download.go)
	}
	cl, err := d.claim(ctx, p, sess, cands[:1], c.racing)
	c.racing = c.racing || cl.raced
	if err != nil || len(cl.ins) == 0 {
		return 1, nil, err
	}
	in := cl.ins[0]
	c.claimed++
	c.quota.Claimed(in.ListedSize)
	return 1, func() error { return d.runClaimed(ctx, p, sess, in, cl.opening, true) }, nil
}

// followingGroups returns g and the groups that follow it in cands, as
// many as slots of the partner's pool are free right now (each taken
// here, for its group: slotsFor[k-1] is group k's), within
// max_files_per_poll and the partner's spool quota. A partner's groups
// then overlap from their claims on: claimed one after another, each
// would wait a round trip to the site for its renames, under the
// partner's claim lock, before the next could start. While another
// replica claims from the partner (racing) a group is claimed alone, one
// rename at a time (claim).
func (c *claimLoop) followingGroups(cands, g []candidate) (groups [][]candidate, slotsFor []func(func() error)) {
	groups = [][]candidate{g}
	if c.racing {
		return groups, nil
	}
	left := c.p.cfg.Limits.MaxFilesPerPoll - c.claimed - len(g)
	bytes := c.quota.Used
	for _, x := range g {
		bytes += x.Size
	}
	for rest := cands[len(g):]; len(rest) > 0; {
		if c.quota.Max > 0 && bytes >= c.quota.Max {
			break
		}
		next := groupAt(c.p.cfg, rest, left, c.p.nocase.Load())
		if next == nil {
			break
		}
		slot := c.pool.TryTake()
		if slot == nil {
			break
		}
		groups, slotsFor = append(groups, next), append(slotsFor, slot)
		for _, x := range next {
			bytes += x.Size
		}
		left -= len(next)
		rest = rest[len(next):]
	}
	return groups, slotsFor
}

// splitClaims returns the claimed rows of each group, in the groups'
// order (a group's files are in no other group).
func splitClaims(groups [][]candidate, ins []*ledger.Intake) [][]*ledger.Intake {
	out := make([][]*ledger.Intake, len(groups))
	if len(groups) == 1 {
		out[0] = ins
		return out
	}
	of := map[string]int{}
	for k, g := range groups {
		for _, c := range g {
			of[c.Name] = k
		}
	}
	for _, in := range ins {
		k := of[in.RemoteName]
		out[k] = append(out[k], in)
	}
	return out
}

// setReady records what ready/ still offers, for gauges and status: the
// candidates left of those kept, and beyond, the claimable files the
// bounded listing counted but did not keep.
func (p *partnerRT) setReady(left []candidate, beyond int) {
	var oldest time.Time
	if len(left) > 0 {
		oldest = left[0].MTime
	}
	p.statMu.Lock()
	// the entries the listing passed over (readylist.Refusals) wait in ready/ too:
	// their age raises IntakeReadyBacklog as any file's
	if !p.passedOldest.IsZero() && (oldest.IsZero() || p.passedOldest.Before(oldest)) {
		oldest = p.passedOldest
	}
	p.readyCount, p.oldestReady = len(left)+beyond+p.passedCount, oldest
	p.statMu.Unlock()
}

// hostileBudget is how many hostile entries one poll moves to quarantine:
// half of max_files_per_poll (at least one), so a flood of them never
// takes a whole poll from the partner's good files, and drains anyway.
func hostileBudget(p *partners.Config) int {
	return max(1, p.Limits.MaxFilesPerPoll/2)
}

// list streams ready/ once, non-recursively (sftpconn.Session.ListDir),
// and keeps only what this poll can use, whatever the directory holds:
// the oldest max_files_per_poll claimable files, oldest first, and the
// oldest hostileBudget hostile entries. Memory is bounded by those and
// the work by one pass over the listing; skipped entries are counted by
// reason. beyond is how many claimable files it counted but did not keep.
func (d *claimStage) list(ctx context.Context, p *partnerRT, sess *sftpconn.Session) (cands []candidate, hostile []partners.Skipped, beyond int, err error) {
	cfg := p.cfg
	manifestMode := cfg.Readiness == partners.ReadinessManifest
	keep := readylist.NewOldest(max(cfg.Limits.MaxFilesPerPoll, 1), func(c candidate) (time.Time, string) { return c.MTime, c.Name })
	bad := readylist.NewOldest(hostileBudget(cfg), func(s partners.Skipped) (time.Time, string) { return s.Info.ModTime(), s.Info.Name() })
	var manifests partners.Manifests // manifest mode: the listing's manifests
	var aside []candidate            // manifest mode: data files found unpaired before (readylist.Unpaired)
	total := 0
	// claim: record: taken files stay in ready/ for ever, so what the
	// listing passes is looked up in batches (recordBatch per statement)
	// and files claimed already never reach the bounded sets
	var pendC []candidate
	var pendH []partners.Skipped
	gate := d.feedHolds.Gate(p)            // a held feed's files are left out (targethold.go)
	passed, passedOldest := 0, time.Time{} // entries passed over (readylist.Refusals)
	passOver := func(name string, size int64, mtime time.Time) bool {
		if !p.refused.PassOver(name, size, mtime) {
			return false
		}
		passed++
		if passedOldest.IsZero() || mtime.Before(passedOldest) {
			passedOldest = mtime
		}
		return true
	}
	flush := func() error {
		if len(pendC)+len(pendH) == 0 {
			return nil
		}
		listed := make([]ledger.Listed, 0, len(pendC)+len(pendH))
		for _, c := range pendC {
			listed = append(listed, ledger.Listed{Name: c.Name, Size: c.Size, MTime: c.MTime})
		}
		for _, h := range pendH {
			listed = append(listed, ledger.Listed{Name: recordName(h.Info.Name()), Size: h.Info.Size(), MTime: h.Info.ModTime()})
		}
		taken, err := d.ledger.RecordedAmong(ctx, cfg.ID, listed)
		if err != nil {
			return err
		}
		for _, c := range pendC {
			if taken[c.Name] {
				continue
			}
			switch ok, err := gate.Usable(ctx, c.Feed); {
			case err != nil:
				return err
			case !ok:
				d.metrics.Skipped.WithLabelValues(cfg.ID, string(reason.TargetUnusable)).Inc()
				continue
			}
			total++
			keep.Push(c)
		}
		for _, h := range pendH {
			if !taken[recordName(h.Info.Name())] {
				d.metrics.Skipped.WithLabelValues(cfg.ID, string(h.Reason)).Inc()
				bad.Push(h)
			}
		}
		pendC, pendH = pendC[:0], pendH[:0]
		return nil
	}
	err = sess.ListDir(ctx, sess.Layout.ReadyDir(), func(e os.FileInfo) error {
		c, why := partners.ClassifyEntry(cfg, e)
		if why == "" && !cfg.Records() {
			// a held feed's files wait in ready/ and take no room of
			// the poll's bounded sets from the partner's other feeds
			// (claim: record: after the look-up, which renews the
			// records of the files taken already)
			switch ok, err := gate.Usable(ctx, c.Feed); {
			case err != nil:
				return err
			case !ok:
				why = reason.TargetUnusable
			}
		}
		if why == reason.ManifestFile && e.Mode().IsRegular() {
			manifests.Add(e.Name())
		}
		if cfg.Records() && (why == "" || partners.Hostile(why)) {
			if why == "" {
				pendC = append(pendC, c)
			} else {
				pendH = append(pendH, partners.Skipped{Info: e, Reason: why})
			}
			if len(pendC)+len(pendH) >= recordBatch {
				return flush()
			}
			return nil
		}
		if why != "" {
			if partners.Hostile(why) && p.refused.PassOver(e.Name(), e.Size(), e.ModTime()) {
				why = claimRefused // the site refused to move it to quarantine/ lately
			}
			d.metrics.Skipped.WithLabelValues(cfg.ID, string(why)).Inc()
			if partners.Hostile(why) {
				bad.Push(partners.Skipped{Info: e, Reason: why})
			}
			return nil
		}
		if passOver(c.Name, c.Size, c.MTime) {
			// the site refused to move it lately: the oldest files kept
			// are ones this poll can claim
			d.metrics.Skipped.WithLabelValues(cfg.ID, claimRefused).Inc()
			return nil
		}
		if manifestMode && p.unpaired.Aside(c.Name) && !manifests.Seen(c.Name+partners.ManifestSuffix) {
			aside = append(aside, c) // looked at once every manifest is passed
			return nil
		}
		total++
		keep.Push(c)
		return nil
	})
	if n := sess.TakeImpossibleNames(); n > 0 {
		d.metrics.Skipped.WithLabelValues(cfg.ID, string(reason.ImpossibleName)).Add(float64(n))
		d.log.Warn("the site listed names no directory holds; left alone", "partner", cfg.ID, "reason", string(reason.ImpossibleName), "count", n)
	}
	if err == nil {
		err = flush()
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list %s: %w", sess.Layout.ReadyDir(), err)
	}
	if cfg.Records() {
		// a complete listing renewed every claim whose file it saw
		if _, err := d.ledger.ForgetRecordClaims(ctx, cfg.ID); err != nil {
			return nil, nil, 0, err
		}
	}
	// the data files set aside whose manifest came take their places
	// among the oldest; the others (and any, should the listing have
	// passed more manifests than it remembers) stay unpaired
	var unpaired []string
	for _, c := range aside {
		if manifests.Seen(c.Name+partners.ManifestSuffix) || manifests.Overflowed() {
			total++
			keep.Push(c)
			continue
		}
		d.metrics.Skipped.WithLabelValues(cfg.ID, string(reason.ManifestMissing)).Inc()
		unpaired = append(unpaired, c.Name)
	}
	kept := keep.Sorted()
	var seen map[string]ledger.Seen
	if cfg.Readiness == partners.ReadinessStable {
		// Readiness stable: the kept candidates are recorded (the rest
		// is forgotten, so the table holds at most max_files_per_poll
		// names of the partner however many the directory has), and
		// each is ready only once listings have seen it unchanged for
		// stable_for.
		listed := make([]ledger.Listed, len(kept))
		for i, c := range kept {
			listed[i] = ledger.Listed{Name: c.Name, Size: c.Size, MTime: c.MTime}
		}
		if seen, err = d.ledger.ObserveReady(ctx, cfg.ID, listed); err != nil {
			return nil, nil, 0, err
		}
	}
	for _, c := range kept {
		if seen != nil {
			s := seen[c.Name]
			if partners.ClassifyStable(cfg, c, partners.Unchanged{Since: s.Since, Now: s.Now}) != "" {
				total--
				d.metrics.Skipped.WithLabelValues(cfg.ID, string(reason.NotStable)).Inc()
				continue
			}
		}
		if manifestMode {
			m := c.Name + partners.ManifestSuffix
			if !manifests.Has(m, sess.RegularInReady) {
				total--
				d.metrics.Skipped.WithLabelValues(cfg.ID, string(reason.ManifestMissing)).Inc()
				unpaired = append(unpaired, c.Name)
				continue
			}
			c.Manifest = m
		}
		cands = append(cands, c)
	}
	if manifestMode {
		p.unpaired.Remember(unpaired)
	}
	beyond = max(total-len(cands), 0)
	p.statMu.Lock()
	p.passedCount, p.passedOldest = passed, passedOldest
	p.statMu.Unlock()
	p.setReady(cands, beyond)
	return cands, bad.Sorted(), beyond, nil
}

// quarantineHostile takes an entry of ready/ that can never be processed
// (a symlink or other non-regular entry, an unsafe name, a name no feed
// matches) out of ready/ without reading it: it is claimed by rename under a
// generated name (the original name never enters a path of ours), recorded,
// and held in quarantine/ with a reason file and a receipt for the partner.
func (d *claimStage) quarantineHostile(ctx context.Context, p *partnerRT, sess *sftpconn.Session, h partners.Skipped) error {
	if err := d.workerID.StillHeld(ctx); err != nil {
		return err
	}
	if p.cfg.Records() {
		return d.holdHostileRecord(ctx, p, sess, h)
	}
	dst := sess.Layout.Processing(d.cfg.WorkerID, partners.HostileName(h.Reason))
	// the rename and the row are one step in the partner's claim
	// section, as every claim's: a pause between them past a lease ends
	// the section (its session), so no row is recorded for an entry
	// another replica adopted meanwhile
	var in *ledger.Intake
	err := d.ledger.InClaimSection(ctx, p.cfg.ID, func(c *ledger.ClaimLock) error {
		err := sess.RenameSized(sess.Layout.Ready(h.Info.Name()), dst, h.Info.Size())
		if err != nil {
			if sftpconn.IsNotExist(err) {
				d.metrics.ClaimsLost.WithLabelValues(p.cfg.ID).Inc()
				return nil
			}
			if sftpconn.IsRefused(err) {
				d.claimRefused(p, h.Info.Name(), err)
				p.refused.Remember(h.Info.Name(), h.Info.Size(), h.Info.ModTime())
				return nil
			}
			return fmt.Errorf("claim a hostile entry: %w", err)
		}
		if err := fault.Check("claim:hostile_renamed"); err != nil {
			return err
		}
		claim := &ledger.Intake{Partner: p.cfg.ID, Feed: ledger.NoFeed, RemoteName: printableName(h.Info.Name()), ClaimedPath: dst,
			ListedSize: h.Info.Size(), Worker: d.cfg.WorkerID}
		if err := c.Adopt(ctx, d.ledger, claim); err != nil {
			if errors.Is(err, ledger.ErrTracked) {
				return nil
			}
			return err
		}
		in = claim
		return nil
	})
	if err != nil || in == nil {
		return err
	}
	return d.runFile(ctx, p, sess, in)
}

// printableName renders a name for reports and logs: safe names as they
// are, others quoted with escapes so no control character travels on.
func printableName(name string) string {
	if partners.SafeName(name) {
		return name
	}
	q := strconv.QuoteToASCII(name)
	if len(q) > 300 {
		q = q[:300] + "…"
	}
	return q
}

// hostileReason recovers the reason from a generated hostile name: the
// skip code that made the entry hostile (partners.Hostile).
func hostileReason(claimedPath string) reason.Code {
	name := strings.TrimPrefix(path.Base(claimedPath), partners.HostilePrefix)
	for _, in := range reason.All() {
		if in.Kind.Has(reason.KindSkip) && partners.Hostile(in.Code) && strings.HasPrefix(name, string(in.Code)+"-") {
			return in.Code
		}
	}
	return reason.HostileEntry
}

// resumeOwn adopts files in processing/<worker>/ that have no row (a crash
// between claim rename and insert, or moved there from a stopped worker's
// dir by adoptOrphans) and resumes every live row this worker id holds (a
// restart), taking each over with a new fencing token. due is the look-up
// of this worker's due rows started with the poll: it stands unless a claim
// is recorded here first.
func (d *housekeeping) resumeOwn(ctx context.Context, p *partnerRT, sess *sftpconn.Session, due *background[ownedRows], pool *slots.Pool) error {
	if p.cfg.Records() {
		// claim: record: nothing is ever moved, so there is no
		// processing/ to look through; the rows say what to resume
		p.settled = true
		return d.resumeRows(ctx, p, sess, due, pool)
	}
	p.statMu.Lock()
	polling := p.polling
	p.statMu.Unlock()
	// This worker's dir is listed beside the look through the others'
	// (a first poll does both): one listing's round trips, not two.
	var ownDir *background[[]os.FileInfo]
	moves := p.adoptMoves
	if !p.settled && polling && d.orphans.sweepDue(p) {
		dir := sess.Layout.ProcessingDir(d.cfg.WorkerID)
		ownDir = inBackground(func() ([]os.FileInfo, error) { return sess.ReadDir(dir) })
		defer ownDir.wait()
	}
	if polling {
		// whoever polls the partner adopts what stopped workers left
		// without a row, whatever the affinity (orphans.go)
		if err := d.orphans.adoptOrphans(ctx, p, sess); err != nil {
			return err
		}
	}
	if p.settled {
		// Nothing of this worker can be in its processing dir without a
		// row: the dir was looked through since the last failed poll (or
		// the previous run ended drained), every claim since inserted its
		// row or failed its poll, and adoptOrphans unsettles before a
		// move. An idle poll of a fleet is one listing, not two
		// (docs/performance.md).
		return d.resumeRows(ctx, p, sess, due, pool)
	}
	dir := sess.Layout.ProcessingDir(d.cfg.WorkerID)
	var ents []os.FileInfo
	var err error
	if ownDir != nil && p.adoptMoves == moves {
		ents, err = ownDir.wait()
	} else {
		if ownDir != nil {
			ownDir.wait() // adoptOrphans moved entries in since: list again
		}
		ents, err = sess.ReadDir(dir)
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	if err := fault.Check("resume:listed"); err != nil {
		return err
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = e.Mode().IsRegular()
	}
	// the entries that may have no row: recorded only after a look again
	// in the partner's claim section (adoptOwn); hold: those held unread,
	// and why
	var cands []*ledger.Intake
	hold := map[string]reason.Code{}
	for _, e := range ents {
		if err := d.workerID.StillHeld(ctx); err != nil {
			return err
		}
		name := e.Name()
		if strings.HasPrefix(name, partners.HostilePrefix) {
			// a hostile entry claimed just before a crash: hold it now
			cands = append(cands, &ledger.Intake{Partner: p.cfg.ID, Feed: ledger.NoFeed, RemoteName: name, ClaimedPath: path.Join(dir, name),
				ListedSize: e.Size(), Worker: d.cfg.WorkerID})
			continue
		}
		if strings.HasPrefix(name, partners.ProbePrefix) {
			// a profile measurement killed part way: its probe entry
			removeProbe(sess, path.Join(dir, name), e.IsDir())
			continue
		}
		if strings.HasPrefix(name, ".") {
			continue
		}
		manifest := ""
		if p.cfg.Readiness == partners.ReadinessManifest {
			if strings.HasSuffix(name, partners.ManifestSuffix) && e.Mode().IsRegular() {
				continue // with its data file (the reconciler's, one beside none)
			}
			if have[name+partners.ManifestSuffix] {
				manifest = name + partners.ManifestSuffix
			}
		}
		if why := p.cfg.ClaimedHostile(e); why != "" {
			// not a file of a feed (any more): held unread, under a
			// generated name (adoptOwn)
			cands = append(cands, &ledger.Intake{Partner: p.cfg.ID, Feed: ledger.NoFeed, RemoteName: printableName(name), ClaimedPath: path.Join(dir, name),
				ListedSize: e.Size(), Worker: d.cfg.WorkerID})
			hold[path.Join(dir, name)] = why
			continue
		}
		feed := p.cfg.FeedFor(name)
		if p.cfg.Readiness == partners.ReadinessStable {
			// a file whose intake ended put_back but was not renamed
			// back into ready/ (a crash in between): put it back now
			back, err := d.ledger.WasPutBack(ctx, p.cfg.ID, path.Join(dir, name))
			if err != nil {
				return err
			}
			if back {
				if finishPutBack(d.log, p, sess, path.Join(dir, name), name, e.Size()) {
					d.log.Info("put back a file whose earlier intake changed after its claim", "partner", p.cfg.ID)
				}
				continue
			}
		}
		cands = append(cands, &ledger.Intake{Partner: p.cfg.ID, Feed: feed.Name, RemoteName: name, ClaimedPath: path.Join(dir, name),
			ListedSize: e.Size(), ListedMTime: e.ModTime(), Worker: d.cfg.WorkerID, ManifestName: manifest})
	}
	adopted, err := d.orphans.adoptOwn(ctx, p, sess, cands, hold)
	if err != nil {
		return err
	}
	if adopted > 0 {
		due = nil // rows the look-up began before
	}
	// Every entry of this worker's dir has a row now: whatever happens
	// next in this poll, a failure of it unsettles the partner again
	// (afterPoll).
	p.settled = true
	return d.resumeRows(ctx, p, sess, due, pool)
}

// resumeRows resumes every live row of the partner this worker id holds
// that is due (a restart, a file waiting for its next attempt), taking
// each over with a new fencing token when a slot of pool is free for it,
// and runs it there. due, when not nil, is that look-up
// begun with the poll (only this process changes which of the partner's
// rows this worker id holds, and a poll runs one at a time): its answer
// saves the poll a statement after its dial. A row that fell due since is
// the next poll's.
func (d *housekeeping) resumeRows(ctx context.Context, p *partnerRT, sess *sftpconn.Session, due *background[ownedRows], pool *slots.Pool) error {
	// files that failed wait for their own next attempt (attempt.go)
	var owned ownedRows
	var err error
	if due != nil {
		owned, err = due.wait()
	} else {
		owned, err = d.lookUpOwned(ctx, p.cfg.ID)
	}
	if err != nil {
		return err
	}
	live := owned.due
	// kept only if the claim finds ready/ empty too (claimReady)
	p.ownsNothing = owned.held == 0
	// no file runs on a site whose preparation failed: that is the
	// poll's failure, not theirs (sftpconn.ErrNotPrepared)
	if err := sess.Prepared(); err != nil {
		return err
	}
	for _, old := range live {
		if old.State == ledger.StateOutcomeUnknown {
			continue // the reconciler resolves these from the ledger
		}
		if pool.Failed() {
			return nil // the poll ends with the pool's error
		}
		slot := d.startSlot(pool)
		if slot == nil {
			return nil // the file stays this worker's, resumed at the next start
		}
		// the hold looked at once the slot is had: a file waiting for
		// one is not taken as this worker's after the hold ended
		if err := d.workerID.StillHeld(ctx); err != nil {
			slot(nil)
			return err
		}
		// in the partner's claim section: a takeover of this worker's
		// reconciler makes the row this worker's before its move of the
		// file ends, and both are one step in that section
		var in *ledger.Intake
		err := d.ledger.InClaimSection(ctx, p.cfg.ID, func(c *ledger.ClaimLock) error {
			var err error
			in, err = c.Resume(ctx, d.ledger, old.ID, d.cfg.WorkerID)
			return err
		})
		var fe *ledger.FencedError
		if err != nil {
			slot(nil)
			if errors.As(err, &fe) {
				continue
			}
			return err
		}
		d.runResumed(ctx, p, sess, in, slot)
	}
	return nil
}

// runResumed hands a file the housekeeping resumed its slot, and keeps
// its name in this worker's processing dir for the poll's claims
// (claimReady), which leave a file of that name in ready/ for a later
// poll.
func (d *housekeeping) runResumed(ctx context.Context, p *partnerRT, sess *sftpconn.Session, in *ledger.Intake, slot func(func() error)) {
	if p.resumedNames == nil {
		p.resumedNames = map[string]bool{}
	}
	p.resumedNames[p.nameKey(path.Base(in.ClaimedPath))] = true
	if in.State == ledger.StateClaimed {
		p.resumedBytes += max(in.ListedSize, in.Size) // its download has yet to fill the spool
	}
	slot(func() error { return d.runFile(ctx, p, sess, in) })
}

// nameKey is a name as the partner's site tells names apart.
func (p *partnerRT) nameKey(name string) string {
	if p.nocase.Load() {
		return strings.ToLower(name)
	}
	return name
}

// runFile runs one file; losing it to another owner is counted and is not
// an error of the poll.
func (d *Daemon) runFile(ctx context.Context, p *partnerRT, sess *sftpconn.Session, in *ledger.Intake) error {
	return d.runClaimed(ctx, p, sess, in, nil, false)
}

// runClaimed is runFile for a file just claimed by this poll (claimed),
// with the file opened behind its claim's RENAME (nil: none), which its
// download takes (openClaimed) and which is closed if the run never gets
// there.
func (d *Daemon) runClaimed(ctx context.Context, p *partnerRT, sess *sftpconn.Session, in *ledger.Intake, opening *sftpconn.Opening, claimed bool) error {
	r, err := d.newRun(p, sess, in)
	if err != nil {
		if opening != nil {
			opening.Discard()
		}
		return err
	}
	r.opening, r.placed = opening, claimed
	defer func() {
		if r.opening != nil {
			r.opening.Discard()
		}
	}()
	return r.runAlone(ctx)
}

// runAlone runs a file on the per-file path from the state it is in.
func (r *fileRun) runAlone(ctx context.Context) error {
	err := r.run(ctx)
	var fe *ledger.FencedError
	if errors.As(err, &fe) {
		r.fencedOut(fe.Step)
		return nil
	}
	if errors.Is(err, sftpconn.ErrNotPrepared) {
		// the site's failure, not the file's: no attempt of it is
		// counted, and the poll ends with it
		return fmt.Errorf("intake %d: %w", r.in.ID, err)
	}
	if err != nil {
		// one file's failure never stops the partner's poll (attempt.go)
		if err := r.settle(ctx, err); err != nil {
			return fmt.Errorf("intake %d: %w", r.in.ID, err)
		}
	}
	return nil
}

// fencedOut counts and logs a file lost to another owner.
func (r *fileRun) fencedOut(step string) {
	r.d.metrics.Fenced.WithLabelValues(r.in.Partner).Inc()
	r.log.Warn("file lost to another owner; stopped work on it", "step", step)
}

// removeProbe removes a leftover probe entry of a killed profile
// measurement from the worker's processing dir (gone already is fine).
func removeProbe(sess *sftpconn.Session, p string, dir bool) {
	if dir {
		_ = sess.RemoveDirectory(p)
		return
	}
	_ = sess.Remove(p)
}
