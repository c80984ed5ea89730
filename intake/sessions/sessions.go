// Package sessions is the daemon's SFTP session policy: the config
// (Policy), the dial bound per server and the open sessions (Book), which
// sessions to close when idle or for room (MakeRoom, CloseIdle), and the
// phase of each partner's polls (Schedule).
package sessions

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
	"github.com/partner-intake/partner-intake/internal/setting"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// The session policy (a fleet of partners on one daemon).
//
//   - Dials are bounded per SSH server (Policy.MaxParallelDials,
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
//     PollStagger), on a grid of PhaseGrain: a thousand partners `@every
//     30s` are polled evenly over the 30 s, a second's in one wake-up of
//     the scheduler, and their first polls after a start are spread the
//     same way; a handful of partners are still polled within a moment of the
//     start. Cron-expression schedules run as written (a wall-clock time
//     was asked for) and are polled at once on start.
//   - Partners whose sites are one server under one account with the same
//     credentials share SSH connections, PartnersPerConnection (default 3)
//     a connection, each on channels of its own (partners/sftpconn/conns.go): a
//     thousand partners on a hub's own SFTP server cost it 334 logins, not
//     1,000. Three, as a partner opens up to three channels and OpenSSH
//     allows 10 a connection by default (MaxSessions); a site that refuses
//     a channel gets no more sessions on that connection. A request that
//     hangs ends its own partner's session only; the connection then takes
//     no new sessions, and the other partners' sessions on it are given up
//     at their next poll (stale) and dialled afresh.
//   - With several replicas, a replica that does not poll a partner drops
//     its session (affinity.go): sessions are the owner's.

// Policy is the daemon's SFTP session policy (config key sessions).
type Policy struct {
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

// Validate fills the defaults and checks the values.
func (s *Policy) Validate() error {
	if err := setting.Between("sessions.max_parallel_dials", &s.MaxParallelDials, DefaultMaxParallelDials, 1, 1000); err != nil {
		return err
	}
	if s.MaxOpen < 0 {
		return fmt.Errorf("sessions.max_open: %d must be 0 (no cap) or positive", s.MaxOpen)
	}
	if err := setting.Positive("sessions.idle_close", &s.IdleClose, DefaultIdleClose); err != nil {
		return err
	}
	return setting.Between("sessions.partners_per_connection", &s.PartnersPerConnection, DefaultPartnersPerConnection, 1, 100)
}

// Book is the daemon's account of its sessions: the dial bound of each
// server and how many sessions are open.
type Book struct {
	max   int
	open  atomic.Int64
	gauge prometheus.Gauge

	mu       sync.Mutex
	slots    map[string]chan struct{} // server -> a token per dial in flight
	inFlight map[string]int
	peak     int   // the most dials ever in flight at once to one server (tests)
	dialed   int64 // dials started (tests)
}

// NewBook is a book of max dials in flight per server; gauge counts the
// sessions open.
func NewBook(max int, gauge prometheus.Gauge) *Book {
	return &Book{max: max, gauge: gauge, slots: map[string]chan struct{}{}, inFlight: map[string]int{}}
}

// Server is the key of a partner's dial bound: its address, the host
// case-folded (as partners.CheckSites compares sites).
func Server(p *partners.Config) string { return strings.ToLower(p.SFTP.Address) }

// Acquire waits for a dial slot of the server.
func (b *Book) Acquire(ctx context.Context, srv string) error {
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

// Release gives a dial slot of the server back.
func (b *Book) Release(srv string) {
	b.mu.Lock()
	b.inFlight[srv]--
	slot := b.slots[srv]
	b.mu.Unlock()
	<-slot
}

// Stats are the dials started, the most ever in flight to one server and
// the dials in flight now (tests).
func (b *Book) Stats() (dialed, peak, inFlight int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.inFlight {
		inFlight += int64(n)
	}
	return b.dialed, int64(b.peak), inFlight
}

// Opened counts a session opened.
func (b *Book) Opened() { b.gauge.Set(float64(b.open.Add(1))) }

// Closed counts a session closed.
func (b *Book) Closed() { b.gauge.Set(float64(b.open.Add(-1))) }

// Open is how many sessions are open now.
func (b *Book) Open() int64 { return b.open.Load() }

// A Holder is one partner's session as the policy sees it.
type Holder interface {
	// LastUsed is when a poll last used the session (unix ns); ok is
	// false without a session.
	LastUsed() (at int64, ok bool)
	// DropUnlessPolling closes the session unless a poll holds the
	// partner (polling) or the session was used after cut (unix ns), and
	// reports whether it closed one.
	DropUnlessPolling(cut int64) (polling, closed bool)
}

// MakeRoom closes least recently used sessions of the holders (listed at
// the cap only) other than self while the open sessions are at limit (0:
// no cap), and returns those it closed. The cap is soft: when the least recently used one is in use
// (its partner polling), nothing more is closed.
func (b *Book) MakeRoom(self Holder, holders func() []Holder, limit int) []Holder {
	var out []Holder
	var all []Holder // read once, at the cap only: a dial under it makes no list
	for limit > 0 && b.open.Load() >= int64(limit) {
		if all == nil {
			all = holders()
		}
		var lru Holder
		var at int64
		for _, q := range all {
			u, ok := q.LastUsed()
			if q == self || !ok {
				continue
			}
			if lru == nil || u < at {
				lru, at = q, u
			}
		}
		if lru == nil {
			return out
		}
		polling, closed := lru.DropUnlessPolling(1<<63 - 1)
		if polling {
			return out
		}
		if closed {
			out = append(out, lru)
		}
	}
	return out
}

// CloseIdle closes the sessions unused since before now - idle of
// holders that are not polling, and returns those it closed.
func CloseIdle(all []Holder, now time.Time, idle time.Duration) []Holder {
	cut := now.Add(-idle).UnixNano()
	var out []Holder
	for _, p := range all {
		if u, ok := p.LastUsed(); !ok || u > cut {
			continue // no session, or used lately
		}
		if _, closed := p.DropUnlessPolling(cut); closed {
			out = append(out, p)
		}
	}
	return out
}

// JanitorEvery is how often idle sessions are looked for under idle.
func JanitorEvery(idle time.Duration) time.Duration {
	return min(max(idle/4, 50*time.Millisecond), time.Minute)
}

// Schedule adds a partner's poll schedule (spec) to c, poking it at each
// tick, and returns its entry and how long after now its first poll
// comes: an `@every` schedule is phased by the partner's stable offset
// within min(interval, partners × stagger), and every later tick keeps
// that phase; a cron expression runs as written, with a first poll at
// once.
func Schedule(c *cron.Cron, id, spec string, now time.Time, partners int, stagger time.Duration, poke func()) (cron.EntryID, time.Duration, error) {
	every, ok := schedule.Every(spec)
	if !ok {
		e, err := c.AddFunc(spec, poke)
		return e, 0, err
	}
	off := Offset(id, every, partners, stagger)
	return c.Schedule(schedule.Phased{Origin: now.Add(off), Every: every}, cron.FuncJob(poke)), off, nil
}

// Offset is a partner's phase within its interval, on a grid of
// PhaseGrain where the window is many grains wide: the partners of one
// grain are polled in one wake-up of the scheduler.
func Offset(id string, every time.Duration, partners int, stagger time.Duration) time.Duration {
	window := min(every, time.Duration(partners)*stagger)
	off := schedule.Offset(id, window)
	if window >= 8*PhaseGrain {
		off = off.Truncate(PhaseGrain)
	}
	return off
}

// PhaseGrain is the grid of the partners' poll phases.
const PhaseGrain = time.Second

// Slot is one partner's session: open or none, and when a poll last used
// it. Its zero value holds none; Book counts the sessions it opens and
// closes.
type Slot struct {
	Book *Book

	mu       sync.Mutex
	sess     *sftpconn.Session
	has      atomic.Bool  // sess != nil, read without mu
	lastUsed atomic.Int64 // unix ns a poll last used the session (idle close, LRU)
}

// Get returns the slot's open session or dials one (dial), within the
// dial bound of the server srv; room runs first, to make room under the
// cap on open sessions. The bound is on logins, as the server's
// MaxStartups counts unauthenticated connections: dial calls loggedIn once
// its login is done (or joined a connection logged in), and what it does
// after (the site's directories, its profile measured) holds no other
// partner's dial back. A stale session (its connection ended, or takes
// no new sessions since another partner's request on it hung) is given
// up (stale) and dialled afresh; dialled reports a session dialled now.
func (s *Slot) Get(ctx context.Context, srv string, room func(), dial func(ctx context.Context, loggedIn func()) (*sftpconn.Session, error)) (sess *sftpconn.Session, stale, dialled bool, err error) {
	if s.has.Load() {
		s.mu.Lock()
		cur := s.sess
		s.mu.Unlock()
		if cur != nil && !cur.Stale() {
			s.Touch()
			return cur, false, false, nil
		}
		stale = cur != nil && s.DropIf(cur)
	}
	room()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != nil {
		s.Touch()
		return s.sess, stale, false, nil
	}
	if err := s.Book.Acquire(ctx, srv); err != nil {
		return nil, stale, false, err
	}
	var once sync.Once
	loggedIn := func() { once.Do(func() { s.Book.Release(srv) }) }
	sess, err = dial(ctx, loggedIn)
	loggedIn()
	if err != nil {
		return nil, stale, false, err
	}
	s.sess = sess
	s.has.Store(true)
	s.Book.Opened()
	s.Touch()
	return sess, stale, true, nil
}

// Touch records that a poll used the session now.
func (s *Slot) Touch() { s.lastUsed.Store(time.Now().UnixNano()) }

// LastUsed is when a poll last used the session (unix ns); ok is false
// without a session.
func (s *Slot) LastUsed() (at int64, ok bool) { return s.lastUsed.Load(), s.has.Load() }

// Deadline reports a poll's error as the session's
// *sftpconn.TimeoutError when the site's silence is why the poll failed
// (partners/watchdog.go).
func (s *Slot) Deadline(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil || s.sess == nil {
		return err
	}
	return s.sess.Deadline(err)
}

// Drop closes the session; the next poll dials again. It reports whether
// a session was open.
func (s *Slot) Drop() bool { return s.DropIf(nil) }

// DropIf closes the session if it is x (any session: nil), and reports
// whether it closed one.
func (s *Slot) DropIf(x *sftpconn.Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil || (x != nil && s.sess != x) {
		return false
	}
	s.sess.Close()
	s.sess = nil
	s.has.Store(false)
	if s.Book != nil {
		s.Book.Closed()
	}
	return true
}
