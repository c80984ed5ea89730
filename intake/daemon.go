// Package intake is the pipeline: poll ready/, claim by rename, spool,
// decide (duplicate, conflict, new), plan, apply in ledgered chunks, and
// archive with a receipt. One protocol step per file of this package.
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"

	"github.com/partner-intake/partner-intake/intake/affinity"
	"github.com/partner-intake/partner-intake/intake/backpressure"
	"github.com/partner-intake/partner-intake/intake/daemoncfg"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/intake/pollrecord"
	"github.com/partner-intake/partner-intake/intake/readylist"
	"github.com/partner-intake/partner-intake/intake/sessions"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/intake/targethold"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/intake/workerid"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/schedule"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
	"github.com/partner-intake/partner-intake/spool"
)

// The daemon's own configuration is intake/daemoncfg's; these are its
// names here.
type (
	// Config is the daemon's own configuration.
	Config = daemoncfg.Config
	// RetryPolicy bounds the retries of one file.
	RetryPolicy = daemoncfg.RetryPolicy
)

// Defaults of Config and RetryPolicy, and the replica affinity modes.
const (
	DefaultDrain         = daemoncfg.DefaultDrain
	DefaultSpoolMinFree  = daemoncfg.DefaultSpoolMinFree
	DefaultRetryAttempts = daemoncfg.DefaultRetryAttempts
	DefaultRetryWithin   = daemoncfg.DefaultRetryWithin
	DefaultRetryBase     = daemoncfg.DefaultRetryBase
	DefaultRetryMax      = daemoncfg.DefaultRetryMax
	AffinityPartner      = daemoncfg.AffinityPartner // one live replica polls each partner
	AffinityNone         = daemoncfg.AffinityNone    // every replica polls every partner
)

// PoolConfig is the pgxpool configuration the daemon expects
// (daemoncfg.PoolConfig).
func PoolConfig(url, worker string, lease time.Duration) (*pgxpool.Config, error) {
	return daemoncfg.PoolConfig(url, worker, lease)
}

// Daemon runs one poller per partner.
type Daemon struct {
	cfg     Config
	db      *pgxpool.Pool
	spool   *spool.Spool
	ledger  *ledger.Ledger
	metrics *metrics.Set
	log     *slog.Logger
	// parts are the partners (partnerset.go); a reload swaps them
	parts *partnerSet

	targets   *target.Cache      // the checked target of each feed mapping
	orphans   *orphanAdopter     // claims without a row (orphans.go)
	feedHolds *targethold.Keeper // feeds whose target cannot be written (targethold.go)
	sessions  *sessionKeeper     // the partners' SFTP sessions (sessions.go, intake/sessions)

	noClaims atomic.Bool
	// workerID is this process's hold on its worker id (intake/workerid)
	workerID *workerid.Keeper
	replica  *replica        // this daemon's row in intake_worker (replica.go)
	peers    *affinity.Peers // which replica polls a partner (intake/affinity)
	// life is the daemon's start/stop (internal/lifecycle); mu orders
	// Start before a concurrent Stop, which reads cron.
	life   lifecycle.Base
	mu     sync.Mutex
	cron   *cron.Cron
	runCtx context.Context // the daemon's own, for pollers a reload starts

	gauges  *gauges             // the database-derived gauges (gauges.go)
	space   *backpressure.Guard // spool backpressure (intake/backpressure)
	signals testSignals
	ahead   chan struct{}        // slots of files applied ahead (ahead.go)
	polls   *pollrecord.Recorder // poll outcomes not yet written (intake/pollrecord)
}

// New builds a daemon. Partners must have been validated.
func New(cfg Config, parts []partners.Config, db *pgxpool.Pool, sp *spool.Spool, reg prometheus.Registerer, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sp, err := sp.ForWorker(cfg.WorkerID)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, db: db, spool: sp, ledger: ledger.New(db, cfg.Lease).WithClaimPool(cfg.ClaimDB).WithBeatPool(beatPool(db)),
		metrics: metrics.New(reg), log: slog.New(pgerr.Handler(log.Handler())).With("component", "intake", "worker", cfg.WorkerID),
		parts: &partnerSet{byID: map[string]*partnerRT{}}, targets: target.NewCache(db)}
	d.replica = &replica{ledger: d.ledger, workerID: cfg.WorkerID, lease: cfg.Lease, parts: d.parts, log: d.log, beat: &d.signals.WorkerBeat,
		life: &d.life, startMu: &d.mu}
	d.workerID = workerid.New(workerid.Config{DB: db, WorkerID: cfg.WorkerID, Lease: cfg.Lease, Log: d.log,
		Held: d.metrics.WorkerIDHeld, Regained: d.replica.regained})
	d.replica.id = d.workerID
	d.peers = affinity.New(affinity.Config{Ledger: d.ledger, WorkerID: cfg.WorkerID, Lease: cfg.Lease, Everyone: cfg.Affinity == AffinityNone,
		Registered: d.replica.registered.Load, Partners: d.parts.ids, Gained: d.Poke, Seen: func(m map[string][]string) { d.signals.Peers.Signal(m) },
		Owned: d.metrics.PartnerOwned, Log: d.log})
	d.feedHolds = &targethold.Keeper{DB: db, Targets: d.targets, Partners: func() []targethold.Partner { return holdPartners(d.parts.list()) },
		Held: d.metrics.TargetHeld, Log: d.log}
	d.space = &backpressure.Guard{Spool: sp, MinFree: &d.cfg.SpoolMinFree, Metrics: d.metrics, Log: d.log}
	d.gauges = &gauges{ledger: d.ledger, spool: sp, parts: d.parts, holds: d.feedHolds, metrics: d.metrics, log: d.log}
	d.orphans = &orphanAdopter{ledger: d.ledger, workerID: cfg.WorkerID, lease: cfg.Lease, metrics: d.metrics, log: d.log}
	d.polls = pollrecord.New(d.ledger, cfg.WorkerID, d.log)
	conns := sftpconn.NewConns(cfg.Sessions.PartnersPerConnection)
	d.metrics.Connections(reg, conns)
	d.sessions = &sessionKeeper{policy: cfg.Sessions, workerID: cfg.WorkerID, book: sessions.NewBook(cfg.Sessions.MaxParallelDials, d.metrics.SessionsOpen),
		conns: conns, parts: d.parts, metrics: d.metrics, log: d.log, signals: &d.signals,
		sites: &siteCheck{ledger: d.ledger, conns: conns, parts: d.parts, workerID: cfg.WorkerID, log: d.log}}
	// at most this many files are applied ahead of their plan at once,
	// each holding a connection of the work pool through its download
	slots := 1
	if db != nil {
		slots = max(1, int(db.Config().MaxConns)/2-1)
	}
	d.ahead = make(chan struct{}, slots)
	for i := range parts {
		p := &parts[i]
		if _, dup := d.parts.byID[p.ID]; dup {
			return nil, fmt.Errorf("partner %s configured twice", p.ID)
		}
		if err := unwrap.CheckPGPKeys(p); err != nil {
			return nil, err
		}
		rt := d.sessions.newPartnerRT(p)
		d.sessions.inForce(rt)
		d.parts.byID[p.ID] = rt
		d.parts.order = append(d.parts.order, p.ID)
	}
	return d, nil
}

// beatPool is the configuration of the pool the replica's heartbeat and
// its files' lease renewals run on (ledger.Ledger.WithBeatPool): the work
// pool's settings, connected lazily, with one connection more than the
// work pool. A file's renewal may wait for the row lock of its own
// chunk's transaction, which holds a connection of the work pool; so at
// most that many renewals wait at once, and one connection is left for
// the replica's heartbeat, the renewals of files between chunks and the
// short statements of claims (the ids they keep: ledger.KeepClaimIDs),
// none of which waits on a lock. A file's fence and a claim's statements
// take an idle connection of the work pool first (ledger's core.short),
// so a one-shot run seldom opens this pool.
func beatPool(db *pgxpool.Pool) *pgxpool.Config {
	if db == nil {
		return nil
	}
	pc := db.Config().Copy()
	pc.MaxConns, pc.MinConns = pc.MaxConns+1, 0
	return pc
}

// PollOnce runs one synchronous cycle for a partner (tests, the demo and
// `intake run --once`).
func (d *Daemon) PollOnce(ctx context.Context, partner string) error {
	p, ok := d.parts.get(partner)
	if !ok {
		return fmt.Errorf("unknown partner %q", partner)
	}
	if err := d.workerID.AwaitHeld(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired() {
		// a reload removed or replaced the runtime while this waited for
		// it: it polls no more (reload.go)
		return fmt.Errorf("partner %q was removed or replaced by a reload", partner)
	}
	err := p.deadline(d.pollOnce(ctx, p))
	if errors.Is(err, errNotOwner) {
		return nil
	}
	if errors.Is(err, errWorkerIDNotHeld) {
		return err
	}
	p.afterPoll(err, d.metrics, d.polls)
	d.polls.Flush() // a poll asked for is recorded when it returns
	return err
}

// afterPoll records a poll's outcome: the partner's state, its session
// (dropped after a failure), its gauges and the outcome for `intake
// status` (intake/pollrecord).
func (p *partnerRT) afterPoll(err error, m *metrics.Set, polls *pollrecord.Recorder) {
	if err != nil {
		p.settled = false     // a claim of this poll may be left without a row
		p.ownsNothing = false // or a row: the next poll looks up
	}
	p.statMu.Lock()
	p.up = err == nil
	if err == nil {
		p.lastOK = time.Now()
	} else {
		p.lastErr = pgerr.Redact(err)
	}
	ready, oldest := p.readyCount, p.oldestReady
	p.statMu.Unlock()
	p.slot.Touch() // the session (if any) was used until now: idle from here
	if p.redial.Swap(false) && err == nil {
		p.drop() // a file met an SFTP failure (attempt.go): dial afresh next time
	}
	if err != nil {
		p.drop()
		m.PollErrors.WithLabelValues(p.cfg.ID).Inc()
		m.PartnerUp.WithLabelValues(p.cfg.ID).Set(0)
	} else {
		m.PartnerUp.WithLabelValues(p.cfg.ID).Set(1)
		// a partner with nothing ready has no series (absent reads as 0)
		if ready > 0 {
			m.ReadyFiles.WithLabelValues(p.cfg.ID).Set(float64(ready))
		} else {
			m.ReadyFiles.DeleteLabelValues(p.cfg.ID)
		}
	}
	// recorded for `intake status` (intake/pollrecord)
	polls.Add(p.cfg.ID, err, ready, oldest)
}

// Start schedules every partner's poll (robfig/cron, UTC, recover, skip if
// still running): a partner on an `@every` schedule is first polled at its
// stable offset and keeps that phase, others at once (sessions.go). Each
// partner has its own goroutine, session and backoff: one partner's outage
// never slows another; their dials share the daemon's bound.
func (d *Daemon) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, err := d.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("intake: daemon %w", err)
	}
	d.runCtx = ctx
	abort := func(err error) error {
		err = d.life.Abort(err)
		d.workerID.Release()
		return err
	}
	// The worker id is this process's alone while it runs (workerid.go);
	// when another live process holds it, the partners' polls are
	// scheduled but do nothing until it is free.
	var inUse *ledger.WorkerIDInUseError
	switch err := d.workerID.Hold(ctx); {
	case err == nil:
		// Registered before the first poll, so that replicas starting
		// together split the partners from their first claims on.
		if err := d.replica.register(ctx); err != nil {
			return abort(err)
		}
	case errors.As(err, &inUse), errors.Is(err, errWorkerIDNotHeld):
		d.workerID.SetAwaiting(true)
		d.life.Go(func() {
			if d.workerID.Await(ctx) {
				d.replica.registerWhenHeld(ctx)
			}
		})
	default:
		return abort(err)
	}
	d.cron = schedule.New(d.log)
	now := time.Now()
	for _, id := range d.parts.order {
		p := d.parts.byID[id]
		first, err := schedulePoll(d.cron, p, now, len(d.parts.order), d.cfg.PollStagger)
		if err != nil {
			return abort(fmt.Errorf("partner %s: poll %q: %w", id, p.cfg.Poll, err))
		}
		d.life.Go(func() { d.loop(ctx, p, first) })
	}
	d.life.Go(func() { d.sessions.janitor(ctx) })
	d.life.Go(func() { d.gauges.loop(ctx) })
	d.life.Go(func() { d.polls.Run(ctx) })
	d.cron.Start()
	d.log.Info("daemon started", "partners", len(d.parts.order))
	return nil
}

// RefreshGauges updates the database-derived gauges now, and reads the
// tables of held feeds whose retry is due (tests, status).
func (d *Daemon) RefreshGauges(ctx context.Context) error {
	d.gauges.refreshSpoolBytes()
	d.feedHolds.Recheck(ctx)
	return d.gauges.refresh(ctx)
}

// Poke asks for a poll of the partner soon (the reconciler does after a
// takeover). It never blocks.
func (d *Daemon) Poke(partner string) {
	if p, ok := d.parts.get(partner); ok {
		p.poke()
	}
}

// Serves reports whether this daemon serves partner: configured, and not
// being removed by a reload (holdNothingLeft). The reconciler of this
// worker asks it in the partner's claim section before it takes a file
// over or adopts one into this worker's dir.
func (d *Daemon) Serves(partner string) bool {
	p, ok := d.parts.get(partner)
	return ok && !p.removing.Load()
}

// TakenOver is what this replica's reconciler calls after it took a file
// of the partner over into this worker's processing dir: the partner is
// polled at once and that poll resumes the file, also when another
// replica polls the partner (this one would otherwise leave it alone
// until its lease expired and a reconciler took it over again, perhaps
// this one, again).
func (d *Daemon) TakenOver(partner string) {
	if p, ok := d.parts.get(partner); ok {
		p.takenOver.Store(true)
		p.poke()
	}
}

// loop polls a partner first after the delay first, then whenever poked;
// after a failed poll it waits out a capped, jittered backoff for that
// partner alone.
func (d *Daemon) loop(ctx context.Context, p *partnerRT, first time.Duration) {
	if !p.awaitFirst(ctx, first) {
		p.drop()
		return
	}
	backoff := time.Second
	for {
		select {
		case <-ctx.Done():
			p.drop()
			return
		case <-p.trigger:
		case <-p.quit:
		}
		p.mu.Lock()
		if p.retired() { // a reload removed or replaced it (reload.go)
			p.mu.Unlock()
			d.parts.retire(p, d.metrics, d.log)
			return
		}
		err := p.deadline(d.pollOnce(ctx, p))
		if errors.Is(err, errNotOwner) || errors.Is(err, errWorkerIDNotHeld) {
			// another replica polls it, or this process does not hold
			// its worker id now (said once, workerid.go): nothing to
			// record
			err = nil
		} else {
			p.afterPoll(err, d.metrics, d.polls)
		}
		p.mu.Unlock()
		d.signals.Polled.Signal(pollDone{p.cfg.ID, err})
		if err == nil || ctx.Err() != nil {
			backoff = time.Second
			continue
		}
		d.log.Warn("poll failed", "partner", p.cfg.ID, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
		case <-p.quit:
		case <-time.After(jitter(backoff)):
			p.poke()
		}
		backoff = min(backoff*2, 5*time.Minute)
	}
}

// claiming reports whether new claims may be made (not while draining).
func (d *Daemon) claiming() bool { return !d.noClaims.Load() }

// Stop stops claiming, lets in-flight files finish for up to the drain
// time, then cancels what remains: an interrupted download leaves only a
// spool temp file (deleted), an interrupted chunk rolls back. It closes the
// partners' SFTP sessions (also those PollOnce opened without Start). Safe
// before Start and more than once. It returns when every goroutine has
// exited.
func (d *Daemon) Stop() {
	d.mu.Lock()
	if !d.life.Halt() {
		d.mu.Unlock()
		d.noClaims.Store(true)
		for _, p := range d.parts.list() {
			p.mu.Lock()
			p.drop()
			p.mu.Unlock()
		}
		d.polls.Flush() // what a PollOnce could not write
		d.workerID.Release()
		d.ledger.CloseBeats() // nothing of the run uses the heartbeat pool now
		return
	}
	d.mu.Unlock()
	d.noClaims.Store(true)
	d.signals.Draining.Signal(struct{}{})
	<-d.cron.Stop().Done()
	idle := make(chan struct{})
	go func() {
		defer close(idle)
		d.parts.mu.RLock()
		all := append(append([]*partnerRT(nil), d.parts.retiring...), d.parts.listLocked()...)
		d.parts.mu.RUnlock()
		for _, p := range all {
			p.mu.Lock() // waits for the partner's poll in flight
			p.mu.Unlock()
		}
	}()
	drained := true
	select {
	case <-idle:
	case <-time.After(d.cfg.Drain):
		drained = false
		d.log.Warn("drain time over; abandoning files in flight (they resume on the next start)")
	}
	d.life.Cancel()
	if d.parts.unlooked.Load() {
		drained = false // a removed partner's dir was never looked through (reload.go)
	}
	d.parts.mu.RLock()
	gone := append([]*partnerRT(nil), d.parts.retiring...)
	d.parts.mu.RUnlock()
	for _, p := range gone { // removed, its poller ended by the stop before it retired
		if _, current := d.parts.get(p.cfg.ID); !current && p.mu.TryLock() {
			if !p.settled || p.takenOver.Load() {
				drained = false
			}
			p.mu.Unlock()
		}
	}
	if drained {
		for _, p := range d.parts.list() {
			p.mu.Lock()
			if !p.settled || p.takenOver.Load() {
				// not looked at since a failure (or ever, this run), or
				// told to look again (takenOver) and not polled since: the
				// next start must look, so the run is not drained
				drained = false
			}
			p.mu.Unlock()
		}
	}
	d.polls.Flush() // the last polls' outcomes, before the worker retires
	// the other replicas take this one's partners on their next poll
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// not registered again by a hold taken again meanwhile (Regained)
	d.replica.registered.Store(false)
	if d.workerID.Held() { // else the id's row is its holder's, or ages out
		if err := d.ledger.RetireWorker(rctx, d.cfg.WorkerID, drained, d.workerID.Lock().HolderPID()); err != nil {
			d.log.Warn("retire worker", "err", err)
		}
	}
	d.workerID.Release()
	d.ledger.CloseBeats() // nothing of the run uses the heartbeat pool now
	d.log.Info("daemon stopped")
}

// CheckTargets loads every feed's target table; a feed whose table cannot
// be written is held (intake/targethold: logged, intake_feed_target_held 1,
// its files left in ready/) and the rest go on. It then compares each
// loaded feed's columns with its target's and logs the findings
// (targethold.LogFindings); these do not stop the daemon. Its error is a failure to
// ask the database.
func (d *Daemon) CheckTargets(ctx context.Context) error { return d.feedHolds.Check(ctx) }

// partnerRT is a partner at run time: its config, session and trigger.
type partnerRT struct {
	cfg     *partners.Config
	trigger chan struct{}
	quit    chan struct{} // closed when a reload removes or replaces it (reload.go)
	cronID  cron.EntryID

	mu         sync.Mutex                    // one poll at a time per partner
	slot       sessions.Slot                 // its session (intake/sessions)
	site       atomic.Pointer[partners.Site] // its tree as the server resolves it, once dialled (site.go)
	overwrites atomic.Bool                   // its server's RENAME overwrites: each session is told (site.go)
	vanish     atomic.Bool                   // its server keeps no empty directory: each session is told (site.go)
	nocase     atomic.Bool                   // its server compares names without case: batch ids from names are folded (site.go)
	restamps   atomic.Bool                   // its server's RENAME does not keep mtimes: a claimed file is known by its size (site.go, remote.go)
	handles    atomic.Int32                  // the files one session of its server holds open, as intake check measured (0: not measured; site.go)
	tempClean  bool                          // this worker's spool temp files of the partner were swept
	redial     atomic.Bool                   // a file met an SFTP failure: the next poll dials afresh
	resumed    bool                          // this worker's own files of the partner were resumed once
	// takenOver: this worker's reconciler took a file of the partner over
	// (TakenOver): the next poll resumes this worker's own files again,
	// even where another replica polls the partner.
	takenOver atomic.Bool
	// removing: a reload is removing the partner and found nothing of
	// this worker's left of it (holdNothingLeft): this worker's
	// reconciler brings no file of it into this worker's hands (Serves)
	removing atomic.Bool
	// settled: nothing of this worker can be left without a row on the
	// partner's site: its processing dir was looked through (resumeOwn)
	// since the last failed poll, or the previous run left none there.
	// Stop records the run as drained only when every partner is settled.
	settled bool
	// ownsNothing: this worker holds no row of the partner, live or
	// waiting for ops' decision (ledger.DueOwnedBy), as the
	// last look-up said (resumeRows) and no poll since listed anything in
	// ready/ to claim (claimReady) or failed; its polls skip the look-up
	// (pollOnce), lookupsSkipped of them so far.
	ownsNothing    bool
	lookupsSkipped int
	orphanSweep    time.Time // the last look through stopped workers' processing dirs (orphans.go)
	adoptMoves     int       // moves adoptOrphans tried into this worker's dir (a listing of it from before is stale)

	statMu      sync.Mutex // what the last poll saw, for gauges and /readyz
	polling     bool       // this replica polls the partner (affinity.go); else it exports no poll gauges for it
	elsewhere   bool       // another live replica polls the partner now (affinity.go)
	up          bool
	lastOK      time.Time
	lastErr     string
	oldestReady time.Time
	readyCount  int
	// the entries of ready/ the last listing passed over (readylist.Refusals):
	// how many, and the oldest's mtime
	passedCount  int
	passedOldest time.Time
	quotaFull    atomic.Bool // the partner's spool is at its quota (limits.max_spool_bytes)

	holds targethold.Feeds // feeds whose target cannot be written (targethold.go)

	refused  readylist.Refusals // entries of ready/ the site refused to move, passed over a while
	unpaired readylist.Unpaired // manifest mode: data files the last listing found without their manifest
	// resumedNames: the names in this worker's processing dir of the files
	// the poll's housekeeping resumed, resumedBytes the listed bytes of
	// those it downloads yet, counted against the spool quota of the
	// poll's claims (runResumed; the poll's goroutine only)
	resumedNames map[string]bool
	resumedBytes int64
}

// concurrency is how many of the partner's files a poll runs side by
// side: its configured concurrency, at most half the files one session of
// its server holds open when `intake check` measured that (a file's run
// holds two on its session at once: its download and its receipt's
// temporary file), at least one.
func (p *partnerRT) concurrency() int {
	n := p.cfg.Concurrency
	if h := int(p.handles.Load()); h > 0 {
		n = max(1, min(n, h/2))
	}
	return n
}

func (p *partnerRT) poke() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Prewarm dials every partner's session in the background, so the SSH
// handshakes overlap whatever the caller does next, within the daemon's
// dial bound (sessions.max_parallel_dials). A failure is left for the
// partner's poll to meet, retry and report.
func (d *Daemon) Prewarm(ctx context.Context) {
	for _, p := range d.parts.list() {
		go func() {
			if _, err := d.sessions.session(ctx, p); err != nil {
				d.log.Debug("prewarm dial failed; the poll dials again", "partner", p.cfg.ID, "err", err)
			}
		}()
	}
}

// PreparePoll prepares the statements of a poll's claim and a file's end
// on a connection of the pool (ledger.PreparePoll). A one-shot run does
// it after its checks, while its SSH logins are still under way; a
// failure only leaves the statements to be prepared when they run.
func (d *Daemon) PreparePoll(ctx context.Context) {
	if err := d.ledger.PreparePoll(ctx); err != nil {
		d.log.Debug("statements not prepared ahead", "err", err)
	}
}

// deadline reports a poll's error as the session's *sftpconn.TimeoutError
// when the site's silence is why the poll failed (partners/watchdog.go).
func (p *partnerRT) deadline(err error) error { return p.slot.Deadline(err) }

// drop closes the session; the next poll dials again. It reports whether
// a session was open.
func (p *partnerRT) drop() bool { return p.slot.Drop() }
