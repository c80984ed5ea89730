package sftpconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/partner-intake/partner-intake/partners"
)

// Sessions of partners whose sites are one SSH server under one account
// with the same credentials (connKey: address, user, key or password
// source, pinned host keys, dial and keepalive settings) may share an SSH
// connection, each with channels of its own (a login
// costs the partner's server 60-90 ms of CPU on the bench machine, a
// channel about 1 ms). Sharing gives nothing away: every session on a
// connection already holds the same authority on the site.
//
// What stays the partner's own: its SFTP channels, their watchdogs and
// their failures. A request the site leaves unanswered ends that session
// alone (its channel readers are broken at once, chanreader.go); the
// connection then takes no new sessions and is closed when its last
// session leaves, the others' polls go on and dial afresh at their next
// poll. What is shared: the transport. A connection that dies (a reset,
// an unanswered keepalive) fails every session on it, as it would have
// failed each of their own connections to the same server. On a server
// that is not OpenSSH, each SFTP packet goes out whole (packetWriter): a
// write the site stops taking holds the other sessions' requests back
// too, until their own op timeouts end them.
//
// Conns bounds the sessions a connection carries (PerConn): a session
// opens up to three channels (main, listing, a large file's ranges), and
// OpenSSH's MaxSessions allows 10 a connection by default. A site that
// refuses a channel on a shared connection gets no more sessions on it;
// the session that was refused dials a connection of its own. A site
// whose channels a connection were measured (SetChannels, from the
// profile `intake check` keeps) gets no more sessions a connection than
// have their three channels each, and no refusal is needed to learn it.
type Conns struct {
	perConn int

	mu    sync.Mutex
	byKey map[string][]*sshConn
	caps  map[string]int // sessions a connection of the key takes, learned from a refusal
	fits  map[string]int // sessions a connection of the key takes, from its measured channels (SetChannels)
	open  atomic.Int64
	dials atomic.Int64
}

// NewConns returns a pool that puts up to perConn sessions on one SSH
// connection (1: every session its own connection).
func NewConns(perConn int) *Conns {
	return &Conns{perConn: max(perConn, 1), byKey: map[string][]*sshConn{}, caps: map[string]int{}, fits: map[string]int{}}
}

// sessionChannels is the most channels a session opens: main, listing,
// and a large file's second channel (Session.Ranges).
const sessionChannels = 3

// SetChannels tells the pool how many channels (sftp subsystems) one SSH
// connection to the partner's site was measured to start (Profile.
// Channels; 0: not measured, nothing changes): connections of its key
// then carry as many sessions as have three channels each, at least one;
// a site that starts one subsystem a connection gets sessions of one
// channel, opened alone. A measurement at its cap (partners.MaxChannelsProbe)
// limits nothing.
func (cs *Conns) SetChannels(p *partners.Config, n int) {
	if n <= 0 {
		return
	}
	if n == 1 {
		oneSubsystemSites.Store(strings.ToLower(p.SFTP.Address), true)
	}
	key := connKey(p)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if n >= partners.MaxChannelsProbe {
		delete(cs.fits, key)
		return
	}
	cs.fits[key] = max(1, n/sessionChannels)
}

// unshared is the pool of Dial: a connection per session.
var unshared = NewConns(1)

// Open is the number of SSH connections open.
func (cs *Conns) Open() int { return int(cs.open.Load()) }

// Logins is the number of SSH connections dialled (each a login on the
// partner's server).
func (cs *Conns) Logins() int64 { return cs.dials.Load() }

// sshConn is one SSH connection and the sessions on it.
type sshConn struct {
	pool *Conns
	key  string

	ready   chan struct{} // closed once dialled; err says how
	started chan struct{} // closed once the dialler's own session is up, or failed
	err     error
	client  *ssh.Client
	raw     net.Conn
	version string       // the server's version string
	hostFP  string       // the SHA256 fingerprint of the host key the server proved
	user    string       // the account logged in to
	upOnce  sync.Once    // the first session's channels are up
	rtt     atomic.Int64 // ns, as the first session's Prepare measured it
	heard   atomic.Int64 // unix ns of the last reply byte on any channel
	sends   sync.Mutex   // held while a channel sends an SFTP packet (packetWriter, wholePackets)

	users    int         // sessions on it or joining it (pool.mu)
	up       int         // sessions on it with their channels started (pool.mu)
	full     bool        // the site refused a channel on it (pool.mu)
	retiring atomic.Bool // a session's channel on it was aborted: no one joins
	closed   chan struct{}
	requests *chanRequests // reads its session channels' requests
}

// openSSH reports whether the server says it is OpenSSH: its sshd hands
// each channel's bytes to that channel's own sftp-server, which answers
// the channel's requests one at a time, in order.
func (c *sshConn) openSSH() bool { return strings.Contains(c.version, "OpenSSH_") }

// wholePackets reports whether the server is sent each SFTP packet whole,
// no other channel's bytes between its first and its last
// (packetWriter): every server but OpenSSH.
func (c *sshConn) wholePackets() bool { return !c.openSSH() }

// connKey identifies the connections a partner's session may share: the
// same server, account, credentials and pinned host keys, and the same
// settings of the connection itself (a partner without legacy_algorithms
// never joins a connection that may have agreed on SHA-1).
func connKey(p *partners.Config) string {
	s := p.SFTP
	return strings.Join([]string{strings.ToLower(s.Address), s.User, s.PrivateKeyFile, s.PasswordFile, s.PasswordEnv,
		s.KnownHostsFile, s.DialTimeout.String(), s.Keepalive.String(), strconv.FormatBool(s.LegacyAlgorithms)}, "\x00")
}

// Dial opens a session for the partner: on a connection of the pool that
// has room, or on a new one.
//
// A site that starts one sftp subsystem a connection may give it to the
// listing channel, whose request goes out with the main one's: the dial
// is then made again with the main channel alone, and the site's later
// dials (this process) open the main channel alone too; its listings go
// through pkg/sftp.
//
// The whole dial has one deadline, sftp.dial_timeout from now (or the
// caller's, if sooner): a joiner's wait for the connection's first
// session, a dial of its own after a refusal or a failed first dial, the
// fallback above and the channels' start all fit in it. A session's
// channels are not started with less than a quarter of it left (a
// joiner that waited that long fails with a deadline error instead): the
// start's timer retires the connection it fires on, which must mean the
// site did not start them, not that the wait took the time.
func (cs *Conns) Dial(ctx context.Context, p *partners.Config) (*Session, error) {
	dl := dialBudget{deadline: time.Now().Add(p.SFTP.DialTimeout), timeout: p.SFTP.DialTimeout}
	if d, ok := ctx.Deadline(); ok && d.Before(dl.deadline) {
		dl.deadline = d
	}
	dl.floor = time.Until(dl.deadline) / 4
	ctx, cancel := context.WithDeadline(ctx, dl.deadline)
	defer cancel()
	s, err := cs.dial(ctx, p, dl)
	if errors.Is(err, errOneSubsystem) {
		oneSubsystemSites.Store(strings.ToLower(p.SFTP.Address), true)
		oneSubsystemFallbacks.Add(1)
		s, err = cs.dial(ctx, p, dl)
	}
	return s, err
}

// dialBudget is a dial's deadline and the least time a session's channels
// are started with.
type dialBudget struct {
	deadline time.Time
	floor    time.Duration
	timeout  time.Duration // sftp.dial_timeout, for errors
}

// late reports whether too little of the dial's time is left to start a
// session's channels, and the error that says so.
func (dl dialBudget) late(p *partners.Config) error {
	if time.Until(dl.deadline) >= dl.floor {
		return nil
	}
	return fmt.Errorf("partner %s: too little of sftp.dial_timeout (%s) left to start a session: %w", p.ID, dl.timeout, os.ErrDeadlineExceeded)
}

func (cs *Conns) dial(ctx context.Context, p *partners.Config, dl dialBudget) (*Session, error) {
	own := false
	for {
		c, joined, err := cs.acquire(ctx, p, own, dl)
		if err != nil {
			return nil, err
		}
		s, err := c.session(p, joined, dl.deadline)
		if !joined {
			close(c.started)
		}
		if err == nil {
			return s, nil
		}
		refused := joined && ctx.Err() == nil && !c.dead() && !errors.Is(err, os.ErrDeadlineExceeded)
		if refused {
			// the site refused this session's channels on a shared
			// connection (its MaxSessions): no one joins it again, the
			// server's key takes as many sessions a connection as
			// fitted, and this session dials its own
			cs.refused(c)
		}
		cs.leave(c)
		if !refused || own {
			return nil, err
		}
		own = true
	}
}

// refused records that the site refused a channel on c: no one joins c
// again, and the connections of its key take at most the sessions up on
// c (at least one).
func (cs *Conns) refused(c *sshConn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c.full = true
	fit := max(1, c.up)
	if cur, ok := cs.caps[c.key]; !ok || fit < cur {
		cs.caps[c.key] = fit
	}
}

// sessionUp counts a session up on c (n 1), or one that closed (n -1).
func (cs *Conns) sessionUp(c *sshConn, n int) {
	cs.mu.Lock()
	c.up += n
	cs.mu.Unlock()
}

// acquire returns a connection for the partner with a place taken on it:
// one with room (joined: once its first session is up), else a new one
// (always when own).
func (cs *Conns) acquire(ctx context.Context, p *partners.Config, own bool, dl dialBudget) (c *sshConn, joined bool, err error) {
	key := connKey(p)
	cs.mu.Lock()
	limit := cs.perConn
	if fit, ok := cs.caps[key]; ok {
		limit = min(limit, fit)
	}
	if fit, ok := cs.fits[key]; ok {
		limit = min(limit, fit)
	}
	if limit > 1 && !own {
		for _, c := range cs.byKey[key] {
			if c.users >= limit || !c.joinable() {
				continue
			}
			c.users++
			cs.mu.Unlock()
			// The dialler's own session first: channels opened beside
			// its would take the site's channel slots before it has any
			// (a site that allows fewer than both sessions need).
			for _, ch := range []chan struct{}{c.ready, c.started} {
				select {
				case <-ch:
				case <-ctx.Done():
					cs.leave(c)
					return nil, false, dialDeadline(ctx.Err(), p.SFTP.DialTimeout)
				}
			}
			cs.mu.Lock()
			ok := c.err == nil && c.joinable()
			cs.mu.Unlock()
			if ok {
				if err := dl.late(p); err != nil {
					cs.leave(c)
					return nil, false, err
				}
				return c, true, nil
			}
			// its dial failed, or its first session found the site's
			// channels too few to share: this partner dials for itself
			// (and gets its own error)
			cs.leave(c)
			cs.mu.Lock()
			break
		}
	}
	if err := dl.late(p); err != nil {
		cs.mu.Unlock()
		return nil, false, err // after a wait or a refusal: no login that could not start a session
	}
	c = &sshConn{pool: cs, key: key, users: 1, ready: make(chan struct{}), started: make(chan struct{}), closed: make(chan struct{})}
	cs.byKey[key] = append(cs.byKey[key], c)
	cs.mu.Unlock()
	c.err = c.dial(ctx, p)
	close(c.ready)
	if c.err != nil {
		close(c.started)
		cs.leave(c)
		return nil, false, c.err
	}
	return c, false, nil
}

// leave gives up a place on c; the last one closes the connection and
// reports true.
func (cs *Conns) leave(c *sshConn) bool {
	cs.mu.Lock()
	c.users--
	last := c.users == 0
	if last {
		if list := slices.DeleteFunc(cs.byKey[c.key], func(o *sshConn) bool { return o == c }); len(list) > 0 {
			cs.byKey[c.key] = list
		} else {
			delete(cs.byKey, c.key)
		}
	}
	cs.mu.Unlock()
	if last && c.client != nil {
		c.client.Close()
	}
	return last
}

// joinable reports whether c takes new sessions (pool.mu).
func (c *sshConn) joinable() bool { return !c.full && !c.retiring.Load() && !c.dead() }

// dead reports whether the connection has ended.
func (c *sshConn) dead() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// sole reports whether one session at most is on c or joining it.
func (c *sshConn) sole() bool {
	c.pool.mu.Lock()
	defer c.pool.mu.Unlock()
	return c.users <= 1
}

// retire takes no new sessions on c: one of its channels was aborted, and
// what that channel holds on both sides ends with the connection, once
// its last session leaves.
func (c *sshConn) retire() { c.retiring.Store(true) }

// dial makes the TCP connection, the key exchange with the pinned host key
// and the login. The whole dial is bounded by the partner's dial timeout:
// ssh.ClientConfig.Timeout covers the TCP dial only, so a deadline is set
// on the connection around the handshake, and the first session's
// channels have what is left of it (session).
func (c *sshConn) dial(ctx context.Context, p *partners.Config) error {
	auth, err := authMethod(p)
	if err != nil {
		return err
	}
	hostKey, algos, err := pinnedHostKey(p.ID, p.SFTP.KnownHostsFile, p.SFTP.Address, p.SFTP.LegacyAlgorithms)
	if err != nil {
		return fmt.Errorf("partner %s: %w", p.ID, err)
	}
	var hostFP string
	cfg := &ssh.ClientConfig{
		Config: sshAlgorithms(p.SFTP.LegacyAlgorithms), // no SHA-1 unless legacy_algorithms
		User:   p.SFTP.User,
		Auth:   []ssh.AuthMethod{auth},
		HostKeyCallback: func(host string, remote net.Addr, key ssh.PublicKey) error {
			err := hostKey(host, remote, key)
			if err == nil {
				hostFP = ssh.FingerprintSHA256(key)
			}
			return err
		},
		HostKeyAlgorithms: algos,
		Timeout:           p.SFTP.DialTimeout,
	}
	// ctx carries the whole dial's deadline (Conns.Dial)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", p.SFTP.Address)
	if err != nil {
		return fmt.Errorf("partner %s: dial %s: %w", p.ID, p.SFTP.Address, dialDeadline(err, p.SFTP.DialTimeout))
	}
	conn = quickAck(conn)
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	sc, chans, reqs, err := ssh.NewClientConn(conn, p.SFTP.Address, cfg)
	if err != nil {
		conn.Close()
		var he *HostKeyError
		if errors.As(err, &he) {
			return he
		}
		return fmt.Errorf("partner %s: ssh handshake with %s: %w", p.ID, p.SFTP.Address, dialDeadline(err, p.SFTP.DialTimeout))
	}
	// the channels' start is bounded by a timer of the session's own
	// (sshConn.session): a deadline on the connection would cut the other
	// sessions' transfers on it
	_ = conn.SetDeadline(time.Time{})
	c.client, c.raw, c.version, c.hostFP, c.user = ssh.NewClient(sc, chans, reqs), conn, string(sc.ServerVersion()), hostFP, p.SFTP.User
	c.pool.dials.Add(1)
	c.pool.open.Add(1)
	go func() {
		c.client.Wait()
		close(c.closed)
		c.pool.open.Add(-1)
	}()
	c.requests = newChanRequests(c.closed)
	go c.keepalive(p.SFTP.Keepalive)
	return nil
}

// keepalive sends keepalive@openssh.com so a dead peer is noticed and NATs
// keep the connection; x/crypto/ssh sends none by itself. A reply on any
// channel within the interval stands for one (a partner polled more often
// than the interval sends none; one polled every 30 s, with the 15 s
// default, about one a poll). An unanswered keepalive closes the
// connection, which fails every request pending on it.
func (c *sshConn) keepalive(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.closed:
			return
		case now := <-t.C:
			if c.heard.Load() > now.Add(-every).UnixNano() {
				continue
			}
			errc := make(chan error, 1)
			go func() {
				_, _, err := c.client.SendRequest("keepalive@openssh.com", true, nil)
				errc <- err
			}()
			select {
			case err := <-errc:
				if err != nil {
					c.client.Close()
					return
				}
			case <-time.After(every):
				c.client.Close()
				return
			case <-c.closed:
				return
			}
		}
	}
}
