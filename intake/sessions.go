package intake

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/intake/sessions"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// The SFTP session policy is intake/sessions' (its doc says what and
// why); this file applies it to the daemon's partners.

// SessionPolicy is the daemon's SFTP session policy (config key sessions).
type SessionPolicy = sessions.Policy

// Defaults of the session policy.
const (
	DefaultMaxParallelDials      = sessions.DefaultMaxParallelDials
	DefaultPartnersPerConnection = sessions.DefaultPartnersPerConnection
	DefaultIdleClose             = sessions.DefaultIdleClose
	DefaultPollStagger           = sessions.DefaultPollStagger
)

// sessionKeeper opens, keeps and closes the partners' sessions.
type sessionKeeper struct {
	policy   SessionPolicy
	workerID string
	book     *sessions.Book  // the dial bound and the open sessions
	conns    *sftpconn.Conns // SSH connections, shared by partners on one account
	sites    *siteCheck      // each partner's site, resolved when first dialled (site.go)
	parts    *partnerSet
	metrics  *metrics.Set
	log      *slog.Logger
	signals  *testSignals
}

// newPartnerRT is a partner's runtime before its first poll. Nothing of
// it shows (inForce) until its config is the one in force: a reload
// refused or abandoned leaves no trace of it.
func (k *sessionKeeper) newPartnerRT(c *partners.Config) *partnerRT {
	return &partnerRT{cfg: c, slot: sessions.Slot{Book: k.book}, trigger: make(chan struct{}, 1), quit: make(chan struct{})}
}

// inForce shows a partner whose config came into force (at the start, or
// by a reload) in its gauges.
func (k *sessionKeeper) inForce(p *partnerRT) {
	legacy := 0.0
	if p.cfg.SFTP.LegacyAlgorithms {
		legacy = 1
	}
	k.metrics.LegacySSH.WithLabelValues(p.cfg.ID).Set(legacy)
}

// session returns the partner's open session or dials one, within its
// server's dial bound (and the daemon's cap on open sessions:
// sessions.Slot.Get).
func (k *sessionKeeper) session(ctx context.Context, p *partnerRT) (*sftpconn.Session, error) {
	if err := k.sites.shared(p); err != nil {
		return nil, err
	}
	s, stale, dialled, err := p.slot.Get(ctx, sessions.Server(p.cfg), func() { k.makeRoom(p) },
		func(ctx context.Context, loggedIn func()) (*sftpconn.Session, error) { return k.dial(ctx, p, loggedIn) })
	if stale {
		k.metrics.SessionsClosed.WithLabelValues("stale").Inc()
	}
	if err != nil {
		return nil, err
	}
	if dialled && !s.Joined() {
		k.metrics.Dials.WithLabelValues(p.cfg.ID).Inc()
	}
	return s, nil
}

// dial opens a session (with its listing channel), says loggedIn, and
// prepares the site: this worker's directories (claim mode), its profile
// (resolve).
func (k *sessionKeeper) dial(ctx context.Context, p *partnerRT, loggedIn func()) (*sftpconn.Session, error) {
	start := time.Now()
	s, err := k.conns.Dial(ctx, p.cfg)
	loggedIn()
	if err != nil {
		return nil, err
	}
	login := time.Since(start)
	defer func() {
		k.log.Debug("session opened", "partner", p.cfg.ID, "login_seconds", login.Seconds(), "seconds", time.Since(start).Seconds(), "rtt_seconds", s.RTT().Seconds())
	}()
	// claim: record writes nothing on the site (no directories); a site
	// that refuses a second channel is listed whole instead
	// (sftpconn.Session.ListDir): claims work either way.
	if err := s.Prepare(k.workerID, !p.cfg.Records()); err != nil {
		s.Close()
		return nil, fmt.Errorf("partner %s: %w", p.cfg.ID, err)
	}
	if err := k.sites.resolve(ctx, p, s); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// holders are the partners as the session policy sees them.
func holders(ps []*partnerRT) []sessions.Holder {
	out := make([]sessions.Holder, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// makeRoom closes least recently used sessions of partners that are not
// polling while the open sessions are at the cap (sessions.Book.MakeRoom).
func (k *sessionKeeper) makeRoom(self *partnerRT) {
	for _, h := range k.book.MakeRoom(self, func() []sessions.Holder { return holders(k.parts.list()) }, k.policy.MaxOpen) {
		k.metrics.SessionsClosed.WithLabelValues("max_open").Inc()
		k.log.Debug("session closed for room under sessions.max_open", "partner", h.(*partnerRT).cfg.ID)
	}
}

// janitor closes sessions no poll has used for IdleClose.
func (k *sessionKeeper) janitor(ctx context.Context) {
	everyTick(ctx, sessions.JanitorEvery(k.policy.IdleClose), func() bool {
		k.closeIdle(time.Now())
		return true
	})
}

// closeIdle closes the sessions unused since before now - IdleClose of
// partners that are not polling.
func (k *sessionKeeper) closeIdle(now time.Time) {
	for _, h := range sessions.CloseIdle(holders(k.parts.list()), now, k.policy.IdleClose) {
		id := h.(*partnerRT).cfg.ID
		k.metrics.SessionsClosed.WithLabelValues("idle").Inc()
		k.log.Debug("idle session closed; the next poll dials again", "partner", id, "idle_close", k.policy.IdleClose)
		k.signals.IdleClosed.Signal(id)
	}
}

// schedulePoll adds the partner's poll schedule to c and returns how long
// after now its first poll comes (sessions.Schedule).
func schedulePoll(c *cron.Cron, p *partnerRT, now time.Time, partners int, stagger time.Duration) (time.Duration, error) {
	id, first, err := sessions.Schedule(c, p.cfg.ID, p.cfg.Poll, now, partners, stagger, p.poke)
	p.cronID = id
	return first, err
}

// LastUsed is when a poll last used the partner's session (unix ns); ok
// is false without a session (sessions.Holder).
func (p *partnerRT) LastUsed() (at int64, ok bool) { return p.slot.LastUsed() }

// DropUnlessPolling closes the partner's session unless it is polling or
// the session was used after cut (sessions.Holder).
func (p *partnerRT) DropUnlessPolling(cut int64) (polling, closed bool) {
	if !p.mu.TryLock() {
		return true, false
	}
	defer p.mu.Unlock()
	at, _ := p.slot.LastUsed()
	return false, at <= cut && p.drop()
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
