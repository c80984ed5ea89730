package partners

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// Session is an SFTP connection to one partner's site.
//
// Every SFTP request on it has a deadline (the partner's sftp.op_timeout,
// renewed by every byte the site sends back: watchdog.go); on expiry the
// session is closed and its calls fail. The methods below shadow
// sftp.Client's to report such a failure as a *TimeoutError.
type Session struct {
	*sftp.Client
	Layout Layout

	partner string
	ssh     *ssh.Client
	watch   *watchdog
	done    chan struct{}
	dirs    sync.Map // remote directories this session has made sure of

	listMu    sync.Mutex
	lister    *rawSFTP  // the channel ListDir lists on (listdir.go)
	listWatch *watchdog // the lister's own watchdog: its own packet stream, the same deadline
	noLister  bool      // the server refused that channel: ListDir reads whole listings

	opts       []sftp.ClientOption
	rangeMu    sync.Mutex
	ranges     *sftp.Client // the second channel large downloads read on (Ranges)
	rangeWatch *watchdog
	noRanges   bool         // the server refused it
	rtt        atomic.Int64 // ns, measured by Prepare; 0: not measured
}

// RTT is the round trip to the site as Prepare measured it (a keepalive
// request, which sshd answers itself), or 0 when it was not measured: an
// estimate, for choices such as reading over two channels.
func (s *Session) RTT() time.Duration { return time.Duration(s.rtt.Load()) }

// TimedOut reports whether the watchdog closed the session.
func (s *Session) TimedOut() bool {
	return s.watch.expired.Load() || s.listWatch.expired.Load() || s.rangeWatch.expired.Load()
}

// Deadline returns err as a *TimeoutError when the watchdog closed the
// session (the call failed because of it), else err unchanged.
func (s *Session) Deadline(err error) error {
	var te *TimeoutError
	if err == nil || !s.TimedOut() || errors.As(err, &te) {
		return err
	}
	return &TimeoutError{Partner: s.partner, After: s.watch.timeout, Err: err}
}

// CloseWhenDone closes the session when ctx is done (a caller's own
// deadline: pkg/sftp calls take no context). Call the returned function
// to stop watching.
func (s *Session) CloseWhenDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { s.Close() })
}

// Stat is sftp.Client.Stat under the session's deadline.
func (s *Session) Stat(p string) (os.FileInfo, error) {
	fi, err := s.Client.Stat(p)
	return fi, s.Deadline(err)
}

// Lstat is sftp.Client.Lstat under the session's deadline.
func (s *Session) Lstat(p string) (os.FileInfo, error) {
	fi, err := s.Client.Lstat(p)
	return fi, s.Deadline(err)
}

// Rename is sftp.Client.Rename under the session's deadline.
func (s *Session) Rename(from, to string) error { return s.Deadline(s.Client.Rename(from, to)) }

// Remove is sftp.Client.Remove under the session's deadline.
func (s *Session) Remove(p string) error { return s.Deadline(s.Client.Remove(p)) }

// MkdirAll is sftp.Client.MkdirAll under the session's deadline.
func (s *Session) MkdirAll(p string) error { return s.Deadline(s.Client.MkdirAll(p)) }

// Open is sftp.Client.Open under the session's deadline (the file's own
// reads are watched too; their errors are the caller's to pass through
// Deadline).
func (s *Session) Open(p string) (*sftp.File, error) {
	f, err := s.Client.Open(p)
	return f, s.Deadline(err)
}

// Create is sftp.Client.Create under the session's deadline.
func (s *Session) Create(p string) (*sftp.File, error) {
	f, err := s.Client.Create(p)
	return f, s.Deadline(err)
}

// EnsureDir creates dir and its parents once per session: a directory
// made sure of is not asked about again (a directory removed meanwhile
// makes the next move fail, the poll fail, and the session be dialled
// anew).
func (s *Session) EnsureDir(dir string) error {
	if _, ok := s.dirs.Load(dir); ok {
		return nil
	}
	if err := s.MkdirAll(dir); err != nil {
		return err
	}
	s.dirs.Store(dir, struct{}{})
	return nil
}

// Prepare readies a session for claims: the directories intake writes to
// made sure of (remembered as EnsureDir's are), in one round trip on the
// listing channel where the site allows (EnsureDirsAtOnce), else side by
// side through pkg/sftp (Layout.EnsureDirs). A keepalive request beside
// them measures the round trip to the site (RTT). The listing channel
// itself was opened by Dial.
func (s *Session) Prepare(worker string, ensure bool) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // beside the rest: the round trip to the site (RTT)
		defer wg.Done()
		start := time.Now()
		if _, _, err := s.ssh.SendRequest("keepalive@openssh.com", true, nil); err == nil {
			s.rtt.Store(int64(time.Since(start)))
		}
	}()
	defer wg.Wait()
	if !ensure {
		return nil
	}
	have := s.EnsureDirsAtOnce(s.Layout.Root, s.Layout.writeDirs(worker))
	dirs, err := s.Layout.ensureDirs(s.Client, worker, have)
	if err != nil {
		return s.Deadline(err)
	}
	for _, d := range dirs {
		s.dirs.Store(d, struct{}{})
	}
	return nil
}

// Dial connects to the partner's site with its pinned host key. The whole
// dial (TCP and SSH handshake) is bounded by the partner's dial timeout:
// ssh.ClientConfig.Timeout covers the TCP dial only, so a deadline is set on
// the connection around the handshake and cleared afterwards.
//
// A site that starts one sftp subsystem a connection may give it to the
// listing channel, whose request goes out with the main one's: the dial
// is then made again with the main channel alone, and the site's later
// dials (this process) open the main channel alone too; its listings go
// through pkg/sftp.
func Dial(ctx context.Context, p *Config) (*Session, error) {
	s, err := dial(ctx, p)
	if errors.Is(err, errOneSubsystem) {
		oneSubsystemSites.Store(strings.ToLower(p.SFTP.Address), true)
		oneSubsystemFallbacks.Add(1)
		s, err = dial(ctx, p)
	}
	return s, err
}

// errOneSubsystem: the site started SFTP on the listing channel and
// refused it on the main one.
var errOneSubsystem = errors.New("the site starts one sftp subsystem a connection")

// oneSubsystemSites are the addresses of the sites found to start one sftp
// subsystem a connection; oneSubsystemFallbacks counts the dials made
// again for it (tests).
var (
	oneSubsystemSites     sync.Map
	oneSubsystemFallbacks atomic.Int64
)

func dial(ctx context.Context, p *Config) (*Session, error) {
	auth, err := authMethod(p)
	if err != nil {
		return nil, err
	}
	hostKey, algos, err := pinnedHostKey(p.ID, p.SFTP.KnownHostsFile, p.SFTP.Address)
	if err != nil {
		return nil, fmt.Errorf("partner %s: %w", p.ID, err)
	}
	cfg := &ssh.ClientConfig{
		User:              p.SFTP.User,
		Auth:              []ssh.AuthMethod{auth},
		HostKeyCallback:   hostKey,
		HostKeyAlgorithms: algos,
		Timeout:           p.SFTP.DialTimeout,
	}
	d := net.Dialer{Timeout: p.SFTP.DialTimeout}
	dctx, cancel := context.WithTimeout(ctx, p.SFTP.DialTimeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", p.SFTP.Address)
	if err != nil {
		return nil, fmt.Errorf("partner %s: dial %s: %w", p.ID, p.SFTP.Address, err)
	}
	conn = quickAck(conn)
	deadline := time.Now().Add(p.SFTP.DialTimeout)
	if dl, ok := dctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	c, chans, reqs, err := ssh.NewClientConn(conn, p.SFTP.Address, cfg)
	if err != nil {
		conn.Close()
		var he *HostKeyError
		if errors.As(err, &he) {
			return nil, he
		}
		return nil, fmt.Errorf("partner %s: ssh handshake with %s: %w", p.ID, p.SFTP.Address, dialDeadline(err, p.SFTP.DialTimeout))
	}
	client := ssh.NewClient(c, chans, reqs)
	watch := newWatchdog(p.SFTP.OpTimeout)
	opts := []sftp.ClientOption{
		sftp.UseConcurrentReads(true),
		sftp.UseConcurrentWrites(true),
		// Never above the server's read limit: pkg/sftp#658 truncates
		// silently there (and the spool compares byte counts anyway).
		sftp.MaxPacketUnchecked(PacketSize(p.SFTP.MaxPacket, string(c.ServerVersion()))),
		sftp.MaxConcurrentRequestsPerFile(16), // 4 MiB in flight at 255 KiB
	}
	// Both channels are opened at once: the first the site confirms
	// carries pkg/sftp, the other ListDir's listings (listdir.go). A site
	// that allows one channel (MaxSessions 1) confirms whichever came
	// first and refuses the other: the one confirmed is the main channel,
	// and listings go through pkg/sftp. At 50 ms that is three round
	// trips for both channels, not four (one after the other: six).
	type channel struct {
		ch  *ssh.Session
		err error
	}
	channels := 2
	if _, one := oneSubsystemSites.Load(strings.ToLower(p.SFTP.Address)); one {
		channels = 1
	}
	opens := make(chan channel, 2)
	for range channels {
		go func() {
			ch, err := client.NewSession()
			opens <- channel{ch, err}
		}()
	}
	primary, other := <-opens, channel{err: errOneSubsystem}
	if channels == 2 {
		if other = <-opens; primary.err != nil {
			primary, other = other, primary
		}
	}
	if primary.err != nil {
		client.Close()
		return nil, fmt.Errorf("partner %s: open sftp channel: %w", p.ID, dialDeadline(primary.err, p.SFTP.DialTimeout))
	}
	listWatch := newWatchdog(p.SFTP.OpTimeout)
	type opened struct {
		c   *rawSFTP
		err error
	}
	lister := make(chan opened, 1)
	go func() {
		if other.err != nil {
			lister <- opened{nil, other.err}
			return
		}
		c, err := startRaw(other.ch, listWatch)
		lister <- opened{c, err}
	}()
	sc, err := startSFTP(primary.ch, watch, opts...)
	l := <-lister
	if err != nil && l.c != nil {
		// The site started SFTP on the listing channel and refused it on
		// the main one: a server that starts one subsystem a connection,
		// and took the two requests, sent together, the other way round
		// (Dial dials again with the main channel alone).
		client.Close()
		return nil, fmt.Errorf("partner %s: %w (%w)", p.ID, errOneSubsystem, err)
	}
	if err != nil {
		if l.c != nil {
			l.c.ch.Close()
		}
		client.Close()
		return nil, fmt.Errorf("partner %s: start sftp subsystem: %w", p.ID, dialDeadline(err, p.SFTP.DialTimeout))
	}
	// The dial deadline covered the subsystem start and the version
	// exchange too (a site that takes the login and then says nothing).
	_ = conn.SetDeadline(time.Time{})
	ready(conn)
	s := &Session{Client: sc, ssh: client, watch: watch, partner: p.ID, done: make(chan struct{}), Layout: NewLayout(p),
		listWatch: listWatch, noLister: l.err != nil, opts: opts, rangeWatch: newWatchdog(p.SFTP.OpTimeout)}
	if l.c != nil {
		s.install(l.c)
	}
	go s.keepalive(p.SFTP.Keepalive)
	go watch.run(s.done, func() { client.Close() })
	go s.listWatch.run(s.done, func() { client.Close() })
	go s.rangeWatch.run(s.done, func() { client.Close() })
	return s, nil
}

// dialDeadline marks an error of the dial's deadline as one, whatever
// layer reports it (x/crypto/ssh and pkg/sftp pass on a bare read error).
func dialDeadline(err error, after time.Duration) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("no answer within %s (sftp.dial_timeout): %w: %w", after, os.ErrDeadlineExceeded, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("no answer within %s (sftp.dial_timeout): %w", after, err)
	}
	return err
}

// newSFTP starts the sftp subsystem as sftp.NewClient does, with the
// watchdog between the client and the channel.
func newSFTP(client *ssh.Client, watch *watchdog, opts ...sftp.ClientOption) (*sftp.Client, error) {
	sess, err := client.NewSession()
	if err != nil {
		return nil, err
	}
	return startSFTP(sess, watch, opts...)
}

// startSFTP starts the sftp subsystem on an open channel.
func startSFTP(sess *ssh.Session, watch *watchdog, opts ...sftp.ClientOption) (*sftp.Client, error) {
	pw, err := sess.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, err := sess.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := sess.RequestSubsystem("sftp"); err != nil {
		return nil, err
	}
	return sftp.NewClientPipe(watchedReader{w: watch, r: pr}, watchedWriter{w: watch, wc: pw}, opts...)
}

// keepalive sends keepalive@openssh.com so a dead peer is noticed and NATs
// keep the connection; x/crypto/ssh sends none by itself. A failed
// keepalive closes the connection, which fails every pending request.
// PacketSize is the SFTP request size for a server: the configured one, or
// (auto) OpenSSH's 255 KiB read limit when the server's version string says
// OpenSSH 8.6 or later (its sftp-server announces that limit), else the
// 32 KiB every server must accept. Measured on loopback: a 96 MB download,
// hashed and fsynced, took 570-710 ms at 32 KiB and 400-435 ms at 255 KiB.
func PacketSize(configured int, serverVersion string) int {
	if configured > 0 {
		return configured
	}
	_, v, ok := strings.Cut(serverVersion, "OpenSSH_")
	if !ok {
		return MinSFTPPacket
	}
	major, rest, _ := strings.Cut(v, ".")
	maj, err1 := strconv.Atoi(major)
	min, err2 := strconv.Atoi(leadingDigits(rest))
	if err1 != nil || err2 != nil || maj < 8 || (maj == 8 && min < 6) {
		return MinSFTPPacket
	}
	return MaxSFTPPacket
}

func leadingDigits(s string) string {
	for i, r := range s {
		if r < '0' || r > '9' {
			return s[:i]
		}
	}
	return s
}

func (s *Session) keepalive(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case now := <-t.C:
			if s.heardSince(now.Add(-every)) {
				// a reply came within the interval (a poll's listing):
				// the connection is alive and its NAT state fresh; a
				// partner polled more often than every interval sends
				// no keepalives at all (one polled every 30 s, with the
				// default 15 s, about one a poll)
				continue
			}
			errc := make(chan error, 1)
			go func() {
				_, _, err := s.ssh.SendRequest("keepalive@openssh.com", true, nil)
				errc <- err
			}()
			select {
			case err := <-errc:
				if err != nil {
					s.ssh.Close()
					return
				}
			case <-time.After(every):
				s.ssh.Close()
				return
			case <-s.done:
				return
			}
		}
	}
}

// heardSince reports whether the site replied on either SFTP channel
// after t.
func (s *Session) heardSince(t time.Time) bool {
	at := max(s.watch.heard.Load(), s.listWatch.heard.Load())
	return at > t.UnixNano()
}

// Ranges returns the session's second SFTP channel, opened on first use
// and kept, or nil when the server refuses one. A large download reads
// alternate ranges of the file on both channels (intake/download.go):
// x/crypto/ssh gives every channel a fixed 2 MiB receive window, so one
// channel carries at most 2 MiB per round trip (about 40 MB/s at 50 ms)
// whatever pkg/sftp keeps in flight; two carry twice that. Opened only
// when a large file comes, so a session of small files costs the site no
// second sftp-server.
func (s *Session) Ranges() *sftp.Client {
	s.rangeMu.Lock()
	defer s.rangeMu.Unlock()
	if s.ranges == nil && !s.noRanges {
		c, err := newSFTP(s.ssh, s.rangeWatch, s.opts...)
		if err != nil {
			s.noRanges = true
			return nil
		}
		s.ranges = c
	}
	return s.ranges
}

// Close ends the session. It is safe to call more than once.
func (s *Session) Close() error {
	select {
	case <-s.done:
		return nil
	default:
		close(s.done)
	}
	// The SSH connection first: every channel ends with it at once.
	// pkg/sftp's Close waits for its channel's end, which with the
	// connection up is a round trip per channel (0.1 s of a `run --once`
	// at 50 ms).
	err := s.ssh.Close()
	s.rangeMu.Lock()
	if s.ranges != nil {
		s.ranges.Close()
	}
	s.rangeMu.Unlock()
	s.Client.Close()
	return err
}

func authMethod(p *Config) (ssh.AuthMethod, error) {
	s := p.SFTP
	switch {
	case s.PrivateKeyFile != "":
		b, err := os.ReadFile(s.PrivateKeyFile)
		if err != nil {
			return nil, fmt.Errorf("partner %s: sftp.private_key_file: %w", p.ID, err)
		}
		signer, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("partner %s: sftp.private_key_file %s: %w", p.ID, s.PrivateKeyFile, err)
		}
		return ssh.PublicKeys(signer), nil
	case s.PasswordFile != "":
		b, err := os.ReadFile(s.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("partner %s: sftp.password_file: %w", p.ID, err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		return ssh.Password(strings.TrimRight(pw, "\r")), nil
	default:
		pw, ok := os.LookupEnv(s.PasswordEnv)
		if !ok {
			return nil, fmt.Errorf("partner %s: sftp.password_env: environment variable %s is not set", p.ID, s.PasswordEnv)
		}
		return ssh.Password(pw), nil
	}
}
