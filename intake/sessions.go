package intake

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"

	"github.com/partner-intake/partner-intake/internal/schedule"
	"github.com/partner-intake/partner-intake/partners"
)

// The session policy (a fleet of partners on one daemon).
//
//   - Dials are bounded per SSH server (SessionPolicy.MaxParallelDials,
//     default 8, for each sftp.address): a start, a reload or a burst of
//     redials never opens more unauthenticated connections at once to one
//     server than OpenSSH's default MaxStartups (10:30:100) begins to
//     refuse. The bound is per server because MaxStartups is: a site that
//     does not answer holds its own partners' dials until their
//     dial_timeout, not every partner's. Prewarm waits on the same bound.
//   - An open session stays open while it is used: a poll on it is a
//     listing, about one round trip, while a dial costs the partner's server
//     a login (about 77 ms of sshd CPU each on the 2-core bench VM) and the
//     daemon a key exchange. A session unused for IdleClose (default 15m:
//     partners polled more often keep theirs) is closed by a janitor and
//     the next poll dials again: no hour-long idle TCP connection for a
//     firewall to drop silently.
//   - MaxOpen (default 0: no cap) bounds the sessions open at once: a dial
//     beyond it first closes the least recently used session of a partner
//     that is not polling (the cap is soft: a session in use is never
//     closed under its poll). Measured (docs/performance.md): an
//     open session costs the daemon about 0.1 MiB, so a thousand fit in the
//     memory target with room; the cap is for daemons with many thousands.
//   - Polls on an `@every` schedule keep a stable phase per partner
//     (schedule.Offset of the partner id) within min(interval, partners ×
//     PollStagger): a thousand partners `@every 30s` are polled evenly over
//     the 30 s, and their first polls after a start are spread the same
//     way; a handful of partners are still polled within a moment of the
//     start. Cron-expression schedules run as written (a wall-clock time
//     was asked for) and are polled at once on start.
//   - Partners whose sites are one server under one account with the same
//     credentials share SSH connections, PartnersPerConnection (default 3)
//     a connection, each on channels of its own (partners/conns.go): a
//     thousand partners on a hub's own SFTP server cost it 334 logins, not
//     1,000. Three, as a partner opens up to three channels and OpenSSH
//     allows 10 a connection by default (MaxSessions); a site that refuses
//     a channel gets no more sessions on that connection. A request that
//     hangs ends its own partner's session only; the connection then takes
//     no new sessions, and the other partners' sessions on it are given up
//     at their next poll (stale) and dialled afresh.
//   - With several replicas, a replica that does not poll a partner drops
//     its session (affinity.go): sessions are the owner's.

// SessionPolicy is the daemon's SFTP session policy (config key sessions).
type SessionPolicy struct {
	// MaxParallelDials bounds the SSH dials (TCP, handshake, login, SFTP
	// start) in flight at once to one server (sftp.address).
	MaxParallelDials int `yaml:"max_parallel_dials"`
	// MaxOpen bounds the open sessions (0: no cap); a dial beyond it
	// closes the least recently used idle one.
	MaxOpen int `yaml:"max_open"`
	// IdleClose closes a session no poll has used for this long.
	IdleClose time.Duration `yaml:"idle_close"`
	// PartnersPerConnection is how many partners' sessions one SSH
	// connection carries where their sites are one server under one
	// account with the same credentials (1: a connection each).
	PartnersPerConnection int `yaml:"partners_per_connection"`
}

// Defaults of the session policy.
const (
	DefaultMaxParallelDials      = 8
	DefaultPartnersPerConnection = 3
	DefaultIdleClose             = 15 * time.Minute
	DefaultPollStagger           = 50 * time.Millisecond
)

func (s *SessionPolicy) validate() error {
	if s.MaxParallelDials == 0 {
		s.MaxParallelDials = DefaultMaxParallelDials
	}
	if s.MaxParallelDials < 1 || s.MaxParallelDials > 1000 {
		return fmt.Errorf("sessions.max_parallel_dials: %d must be between 1 and 1000", s.MaxParallelDials)
	}
	if s.MaxOpen < 0 {
		return fmt.Errorf("sessions.max_open: %d must be 0 (no cap) or positive", s.MaxOpen)
	}
	if s.IdleClose == 0 {
		s.IdleClose = DefaultIdleClose
	}
	if s.IdleClose < 0 {
		return fmt.Errorf("sessions.idle_close: %s must be positive", s.IdleClose)
	}
	if s.PartnersPerConnection == 0 {
		s.PartnersPerConnection = DefaultPartnersPerConnection
	}
	if s.PartnersPerConnection < 1 || s.PartnersPerConnection > 100 {
		return fmt.Errorf("sessions.partners_per_connection: %d must be between 1 and 100", s.PartnersPerConnection)
	}
	return nil
}

// sessionBook is the daemon's account of its sessions: the dial bound of
// each server and how many sessions are open.
type sessionBook struct {
	max   int
	open  atomic.Int64
	gauge prometheus.Gauge

	mu       sync.Mutex
	slots    map[string]chan struct{} // server -> a token per dial in flight
	inFlight map[string]int
	peak     int   // the most dials ever in flight at once to one server (tests)
	dialed   int64 // dials started (tests)
}

func newSessionBook(max int, m *metrics) *sessionBook {
	return &sessionBook{max: max, gauge: m.sessionsOpen, slots: map[string]chan struct{}{}, inFlight: map[string]int{}}
}

// server is the key of a partner's dial bound: its address, the host
// case-folded (as partners.CheckSites compares sites).
func server(p *partners.Config) string { return strings.ToLower(p.SFTP.Address) }

// acquire waits for a dial slot of the server.
func (b *sessionBook) acquire(ctx context.Context, srv string) error {
	b.mu.Lock()
	slot, ok := b.slots[srv]
	if !ok {
		slot = make(chan struct{}, b.max)
		b.slots[srv] = slot
	}
	b.mu.Unlock()
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.mu.Lock()
	b.dialed++
	b.inFlight[srv]++
	b.peak = max(b.peak, b.inFlight[srv])
	b.mu.Unlock()
	return nil
}

func (b *sessionBook) release(srv string) {
	b.mu.Lock()
	b.inFlight[srv]--
	slot := b.slots[srv]
	b.mu.Unlock()
	<-slot
}

// stats are the dials started, the most ever in flight to one server and
// the dials in flight now (tests).
func (b *sessionBook) stats() (dialed, peak, inFlight int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.inFlight {
		inFlight += int64(n)
	}
	return b.dialed, int64(b.peak), inFlight
}

func (b *sessionBook) opened() { b.gauge.Set(float64(b.open.Add(1))) }
func (b *sessionBook) closed() { b.gauge.Set(float64(b.open.Add(-1))) }

// newPartnerRT is a partner's runtime before its first poll.
func (d *Daemon) newPartnerRT(c *partners.Config) *partnerRT {
	legacy := 0.0
	if c.SFTP.LegacyAlgorithms {
		legacy = 1
	}
	d.metrics.legacySSH.WithLabelValues(c.ID).Set(legacy)
	return &partnerRT{cfg: c, book: d.book, trigger: make(chan struct{}, 1), quit: make(chan struct{})}
}

// session returns the partner's open session or dials one, within its
// server's dial bound (and the daemon's cap on open sessions). A stale
// session (its connection ended, or takes no new sessions since another
// partner's request on it hung) is given up and dialled afresh.
func (d *Daemon) session(ctx context.Context, p *partnerRT) (*partners.Session, error) {
	if err := d.siteShared(p); err != nil {
		return nil, err
	}
	if p.hasSess.Load() {
		p.sessMu.Lock()
		s := p.sess
		p.sessMu.Unlock()
		if s != nil && !s.Stale() {
			p.touch()
			return s, nil
		}
		if s != nil && p.dropIf(s) {
			d.metrics.sessionsClosed.WithLabelValues("stale").Inc()
		}
	}
	d.makeRoom(p)
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if p.sess != nil {
		p.touch()
		return p.sess, nil
	}
	srv := server(p.cfg)
	if err := d.book.acquire(ctx, srv); err != nil {
		return nil, err
	}
	s, err := d.dial(ctx, p)
	d.book.release(srv)
	if err != nil {
		return nil, err
	}
	if !s.Joined() {
		d.metrics.dials.WithLabelValues(p.cfg.ID).Inc()
	}
	p.sess = s
	p.hasSess.Store(true)
	d.book.opened()
	p.touch()
	return s, nil
}

// dial opens a session (with its listing channel) and prepares the site:
// this worker's directories (claim mode).
func (d *Daemon) dial(ctx context.Context, p *partnerRT) (*partners.Session, error) {
	start := time.Now()
	s, err := d.conns.Dial(ctx, p.cfg)
	if err != nil {
		return nil, err
	}
	login := time.Since(start)
	defer func() {
		d.log.Debug("session opened", "partner", p.cfg.ID, "login_seconds", login.Seconds(), "seconds", time.Since(start).Seconds(), "rtt_seconds", s.RTT().Seconds())
	}()
	// claim: record writes nothing on the site (no directories); a site
	// that refuses a second channel is listed whole instead
	// (partners.Session.ListDir): claims work either way.
	if err := s.Prepare(d.cfg.WorkerID, !p.cfg.Records()); err != nil {
		s.Close()
		return nil, fmt.Errorf("partner %s: %w", p.cfg.ID, err)
	}
	if err := d.resolveSite(ctx, p, s); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// makeRoom closes least recently used sessions of partners that are not
// polling while the open sessions are at the cap. The cap is soft: when
// the least recently used one is in use, nothing is closed.
func (d *Daemon) makeRoom(self *partnerRT) {
	limit := int64(d.cfg.Sessions.MaxOpen)
	for limit > 0 && d.book.open.Load() >= limit {
		var lru *partnerRT
		var at int64
		for _, q := range d.parts.list() {
			if q == self || !q.hasSess.Load() {
				continue
			}
			if u := q.lastUsed.Load(); lru == nil || u < at {
				lru, at = q, u
			}
		}
		if lru == nil || !lru.mu.TryLock() {
			return
		}
		closed := lru.drop()
		lru.mu.Unlock()
		if closed {
			d.metrics.sessionsClosed.WithLabelValues("max_open").Inc()
			d.log.Debug("session closed for room under sessions.max_open", "partner", lru.cfg.ID)
		}
	}
}

// sessionJanitor closes sessions no poll has used for IdleClose.
func (d *Daemon) sessionJanitor(ctx context.Context) {
	every := min(max(d.cfg.Sessions.IdleClose/4, 50*time.Millisecond), time.Minute)
	everyTick(ctx, every, func() bool {
		d.closeIdle(time.Now())
		return true
	})
}

// closeIdle closes the sessions unused since before now - IdleClose of
// partners that are not polling.
func (d *Daemon) closeIdle(now time.Time) {
	cut := now.Add(-d.cfg.Sessions.IdleClose).UnixNano()
	for _, p := range d.parts.list() {
		if !p.hasSess.Load() || p.lastUsed.Load() > cut || !p.mu.TryLock() {
			continue // no session, used lately, or polling now
		}
		closed := p.lastUsed.Load() <= cut && p.drop()
		p.mu.Unlock()
		if closed {
			d.metrics.sessionsClosed.WithLabelValues("idle").Inc()
			d.log.Debug("idle session closed; the next poll dials again", "partner", p.cfg.ID, "idle_close", d.cfg.Sessions.IdleClose)
			d.signals.IdleClosed.Signal(p.cfg.ID)
		}
	}
}

// schedulePoll adds the partner's poll schedule to the daemon's cron and
// returns how long after now its first poll comes: an `@every` schedule
// is phased by the partner's stable offset within min(interval, partners ×
// PollStagger), and every later tick keeps that phase; a cron expression
// runs as written, with a first poll at once.
func (d *Daemon) schedulePoll(p *partnerRT, now time.Time, partners int) (time.Duration, error) {
	every, ok := schedule.Every(p.cfg.Poll)
	if !ok {
		id, err := d.cron.AddFunc(p.cfg.Poll, p.poke)
		p.cronID = id
		return 0, err
	}
	off := pollOffset(p.cfg.ID, every, partners, d.cfg.PollStagger)
	p.cronID = d.cron.Schedule(schedule.Phased{Origin: now.Add(off), Every: every}, cron.FuncJob(p.poke))
	return off, nil
}

// pollOffset is a partner's phase within its interval.
func pollOffset(id string, every time.Duration, partners int, stagger time.Duration) time.Duration {
	return schedule.Offset(id, min(every, time.Duration(partners)*stagger))
}

// awaitFirst waits out the partner's first-poll offset, then pokes it (a
// poke meanwhile, from the reconciler, polls at once). It reports false
// when the daemon is stopping.
func (p *partnerRT) awaitFirst(ctx context.Context, first time.Duration) bool {
	t := time.NewTimer(first)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-p.quit: // retired before its first poll: the loop ends it
	case <-p.trigger:
	case <-t.C:
	}
	p.poke()
	return true
}

// touch records that a poll used the session now.
func (p *partnerRT) touch() { p.lastUsed.Store(time.Now().UnixNano()) }
