package sftpconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/partner-intake/partner-intake/partners"
)

// Session is an SFTP connection to one partner's site.
//
// Every SFTP request on it has a deadline (the partner's sftp.op_timeout,
// renewed by every reply the site sends back, and every 4 KiB of one:
// watchdog.go; a channel's start is bounded alike, inTime); on expiry the
// session is closed and its calls fail. The methods below shadow
// sftp.Client's to report such a failure as a *TimeoutError.
type Session struct {
	*sftp.Client
	Layout partners.Layout

	partner   string
	ssh       *ssh.Client // the connection's, maybe shared with other partners' sessions (conns.go)
	conn      *sshConn
	joined    bool // the session joined a connection another session dialled
	watch     *watchdog
	done      chan struct{}
	closeOnce sync.Once
	unwatch   atomic.Pointer[func()] // ends the watchdogs' watch (watchAll)
	chMu      sync.Mutex
	chans     []*sessChan  // the channels open, whose readers Close breaks
	aborted   bool         // the channels were broken: a later one is at once
	dirs      sync.Map     // remote directories this session has made sure of
	pins      sync.RWMutex // read-held by an operation CloseWhenDone's close waits for (Pin)

	listMu    sync.Mutex
	lister    *rawSFTP  // the channel ListDir lists on (listdir.go)
	listWatch *watchdog // the lister's own watchdog: its own packet stream, the same deadline
	noLister  bool      // the server refused that channel: ListDir reads whole listings

	opts       []sftp.ClientOption
	rangeMu    sync.Mutex
	ranges     *sftp.Client // the second channel large downloads read on (Ranges)
	rangeWatch *watchdog
	noRanges   atomic.Bool  // the server refused it
	rtt        atomic.Int64 // ns, measured by Prepare; 0: not measured
	packet     int          // the SFTP packet size of its reads and writes
	impossible atomic.Int64 // listed names no directory holds, left out (OneName)
	startLate  atomic.Bool  // a channel's start went unanswered past the op timeout (inTime)

	wholeMu    sync.Mutex    // one listing read whole through pkg/sftp at a time (listDirOn)
	prep       chan struct{} // closed when Prepare's directories are made sure of; nil: nothing pending
	prepErr    error         // why they could not be; set before prep is closed
	prepFailed atomic.Bool

	noClobber atomic.Bool // the server's RENAME overwrites (SetRenameOverwrites)
	vanish    atomic.Bool // the server keeps no empty directory (SetEmptyDirsVanish)

	// the session's methods by concern, each over this session
	dirLister
	sitePrep
	wholeFiles
	renamePolicy
	siteProbes
	chanBook
}

// maxInFlight bounds the requests of one file pkg/sftp has in flight: 4
// MiB at 255 KiB.
const maxInFlight = 16

// uploadRate: a large upload keeps enough WRITEs in flight to carry this
// many bytes a second at the site's round trip (WritesInFlight).
const uploadRate = 200 << 20

// WritesInFlight is the concurrency of one large upload
// (File.ReadFromWithConcurrency): enough to carry uploadRate at the
// site's round trip (RTT), at least one, and at most maxInFlight, which
// is also the number when the round trip was not measured. pkg/sftp has
// one WRITE more than that in flight (its reader sends the next while
// every worker waits for a reply): two on loopback, 17 far. More gains a
// near site nothing and costs it: sshd buffers what the client sends
// ahead of sftp-server's writes, and on loopback a 3.6 MB upload took
// 415–452 ms at concurrency 16 against 18 ms at one
// (docs/performance.md). A far site keeps the bound: at 50 ms, 16 WRITEs
// of 255 KiB carry 80 MB/s.
func (s *Session) WritesInFlight() int { return writesInFlight(s.RTT(), s.packet) }

// writesInFlight is WritesInFlight at round trip rtt with packets of
// packet bytes.
func writesInFlight(rtt time.Duration, packet int) int {
	if rtt <= 0 || packet <= 0 {
		return maxInFlight
	}
	n := int(math.Ceil(float64(uploadRate) * rtt.Seconds() / float64(packet)))
	return min(max(n, 1), maxInFlight)
}

// RTT is the round trip to the site as Prepare measured it (a keepalive
// request, which sshd answers itself), or 0 when it was not measured: an
// estimate, for choices such as reading over two channels.
func (s *Session) RTT() time.Duration { return time.Duration(s.rtt.Load()) }

// TimedOut reports whether the watchdog closed the session, or a
// channel's start went unanswered (inTime).
func (s *Session) TimedOut() bool {
	return s.watch.expired.Load() || s.listWatch.expired.Load() || s.rangeWatch.expired.Load() || s.startLate.Load()
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
// deadline: pkg/sftp calls take no context), once no operation is pinned
// (Pin). Call the returned function to stop watching.
func (s *Session) CloseWhenDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		s.pins.Lock()
		defer s.pins.Unlock()
		s.Close()
	})
}

// Pin keeps CloseWhenDone's close off until the returned function is
// called: for a move whose outcome must be known, which a close cut
// short could leave done on the site and failed to the caller (a RENAME
// the site makes as a copy). The operation stays bounded by the
// session's own timeouts.
func (s *Session) Pin() (unpin func()) {
	s.pins.RLock()
	return s.pins.RUnlock
}

// Stat is sftp.Client.Stat under the session's deadline.
func (s *Session) Stat(p string) (os.FileInfo, error) {
	fi, err := s.Client.Stat(p)
	return sized(p, fi, s.Deadline(err))
}

// Lstat is sftp.Client.Lstat under the session's deadline.
func (s *Session) Lstat(p string) (os.FileInfo, error) {
	fi, err := s.Client.Lstat(p)
	return sized(p, fi, s.Deadline(err))
}

// ErrImpossibleSize: the site stated a size no file has (2^63 bytes or
// more, which pkg/sftp passes on as a negative size).
var ErrImpossibleSize = errors.New("the site stated a size no file has")

// sized refuses a stat whose size no file has: no negative size goes on
// to a limit's comparison or a buffer's length.
func sized(p string, fi os.FileInfo, err error) (os.FileInfo, error) {
	if err == nil && fi.Size() < 0 {
		return nil, fmt.Errorf("stat %s: %w", p, ErrImpossibleSize)
	}
	return fi, err
}

// Rename is sftp.Client.Rename under the session's deadline, once the
// session is prepared (Prepared). On a server whose RENAME overwrites
// (SetRenameOverwrites) it first makes sure the rename cannot overwrite
// (noClobber).
func (s *Session) Rename(from, to string) error {
	if err := s.Prepared(); err != nil {
		return err
	}
	if err := s.clobberCheck(to); err != nil {
		return err
	}
	return s.Deadline(s.Client.Rename(from, to))
}

// renameCopyRate is the slowest a server that makes a RENAME as a copy
// (an object store's gateway: copy, then delete) is allowed to copy
// before its silence counts as a hung site.
const renameCopyRate = 8 << 20 // bytes a second

// AllowCopy lets the site stay silent for size/renameCopyRate beyond
// sftp.op_timeout, until done is called, before its silence counts as a
// hang: around the RENAME of a file of size bytes, which a server that
// copies on RENAME answers only once the bytes are copied (1 GiB: about
// two minutes more). A RENAME that is a rename answers at once, whatever
// the size; a site that hangs is found a little later while a large
// file's RENAME is pending.
func (s *Session) AllowCopy(size int64) (done func()) {
	if size <= 0 || s.watch == nil {
		return func() {}
	}
	return s.watch.allowSlow(time.Duration(float64(size) / renameCopyRate * float64(time.Second)))
}

// RenameSized is Rename of a file of size bytes, allowed the copy time of
// a server that makes a RENAME as a copy (AllowCopy) while it is pending.
func (s *Session) RenameSized(from, to string, size int64) error {
	defer s.AllowCopy(size)()
	return s.Rename(from, to)
}

// ErrRenameTargetExists is a rename refused by the session, as OpenSSH's
// RENAME refuses it, because its target exists on a server whose RENAME
// would have replaced it.
var ErrRenameTargetExists = errors.New("the rename's target exists (the server's RENAME would overwrite it)")

// ErrRenameIntoPartnerDir is a rename into a directory the partner writes
// (ready/, incoming/) refused on a server whose RENAME overwrites: the
// partner may publish the same name there at any moment, and no check
// made before the RENAME can rule that out.
var ErrRenameIntoPartnerDir = errors.New("a rename into the partner's directory, on a server whose RENAME overwrites, could replace a file the partner publishes there")

// SetRenameOverwrites tells the session that its server's plain RENAME
// replaces an existing target (the site's measured profile). From then on
// Rename and RenameAndOpen keep by themselves to what the claim and
// archive protocol relies on, RENAME never overwriting: a target that
// exists fails the rename (ErrRenameTargetExists), found by an LSTAT
// right before it; and a rename into ready/ or incoming/ is refused
// (ErrRenameIntoPartnerDir). The LSTAT and the RENAME are two requests: a
// target is safe from another writer between them only in intake's own
// directories, where a data file's claim, a takeover and an adoption
// into processing/ are made under the partner's claim lock (which
// serializes them across replicas; a manifest follows its data file's
// claim to the name beside it) and every other name intake moves a file
// to carries the file's intake id (one owner at a time, under its
// fencing token).
// PosixRename is left as it is: it replaces on purpose (a receipt
// published onto its own name).
func (s *renamePolicy) SetRenameOverwrites(on bool) { s.noClobber.Store(on) }

// SetEmptyDirsVanish tells the session that its server keeps no empty
// directory (the site's measured profile: an object store's gateway,
// where a directory is the prefix of the names it holds): a listing of a
// directory that is not there is an empty listing, not an error. The
// server makes a directory when a file is written or renamed into it.
func (s *renamePolicy) SetEmptyDirsVanish(on bool) { s.vanish.Store(on) }

// clobberCheck is SetRenameOverwrites's check before a rename to to; nil
// on a server whose RENAME refuses an existing target.
func (s *renamePolicy) clobberCheck(to string) error {
	if !s.noClobber.Load() {
		return nil
	}
	if dir := path.Dir(to); dir == s.Layout.ReadyDir() || dir == s.Layout.IncomingDir() {
		return fmt.Errorf("rename to %s: %w", to, ErrRenameIntoPartnerDir)
	}
	_, err := s.Client.Lstat(to)
	switch {
	case err == nil:
		return fmt.Errorf("rename to %s: %w", to, ErrRenameTargetExists)
	case IsNotExist(err):
		return nil
	default:
		return s.Deadline(err)
	}
}

// PosixRename is sftp.Client.PosixRename under the session's deadline,
// once the session is prepared.
func (s *Session) PosixRename(from, to string) error {
	if err := s.Prepared(); err != nil {
		return err
	}
	return s.Deadline(s.Client.PosixRename(from, to))
}

// Remove is sftp.Client.Remove under the session's deadline, once the
// session is prepared.
func (s *Session) Remove(p string) error {
	if err := s.Prepared(); err != nil {
		return err
	}
	return s.Deadline(s.Client.Remove(p))
}

// MkdirAll is sftp.Client.MkdirAll under the session's deadline, once the
// session is prepared.
func (s *Session) MkdirAll(p string) error {
	if err := s.Prepared(); err != nil {
		return err
	}
	return s.Deadline(s.Client.MkdirAll(p))
}

// Open is sftp.Client.Open under the session's deadline (the file's own
// reads are watched too; their errors are the caller's to pass through
// Deadline).
func (s *Session) Open(p string) (*sftp.File, error) {
	f, err := s.Client.Open(p)
	return f, s.Deadline(err)
}

// Create is sftp.Client.Create under the session's deadline, once the
// session is prepared.
func (s *Session) Create(p string) (*sftp.File, error) {
	if err := s.Prepared(); err != nil {
		return nil, err
	}
	f, err := s.Client.Create(p)
	return f, s.Deadline(err)
}

// EnsureDir creates dir and its parents once per session: a directory
// made sure of is not asked about again (a directory removed meanwhile
// makes the next move fail, the poll fail, and the session be dialled
// anew).
func (s *sitePrep) EnsureDir(dir string) error {
	if err := s.Prepared(); err != nil {
		return err
	}
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
// made sure of (remembered as EnsureDir's are), and the round trip to the
// site measured (RTT: a keepalive request, which sshd answers itself).
//
// Where the site allows a listing channel, Prepare sends the directories'
// MKDIRs and STATs on it (EnsureDirsAtOnce) and returns without waiting
// for the answers: the poll's listings go out right behind them, in the
// same round trip, and see the directories made (the site answers a
// channel's requests in order). Every call that writes to the site
// (Rename, PosixRename, Remove, MkdirAll, EnsureDir, Create, CreateWhole)
// waits for the preparation's end first and fails with its error
// (Prepared); so does a listing that failed, and the session is then
// Stale. Any directory the STATs did not show is made sure of through
// pkg/sftp before the preparation ends; on a site without a listing
// channel (one channel a connection) all of them are, before Prepare
// returns.
func (s *sitePrep) Prepare(worker string, ensure bool) error {
	// called before the session is shared (a second call, after the
	// first's end, on a session nothing else uses meanwhile)
	if err := s.Prepared(); err != nil {
		return err
	}
	rtt := make(chan struct{})
	if r := s.conn.rtt.Load(); r > 0 {
		// measured by the connection's first session, before any other
		// session's transfers could queue in front of the reply
		s.rtt.Store(r)
		close(rtt)
	} else {
		go func() {
			defer close(rtt)
			start := time.Now()
			if _, _, err := s.ssh.SendRequest("keepalive@openssh.com", true, nil); err == nil {
				r := int64(time.Since(start))
				s.rtt.Store(r)
				s.conn.rtt.CompareAndSwap(0, r)
			}
		}()
	}
	if !ensure {
		s.awaitRTT(rtt)
		return nil
	}
	made := s.sendEnsureDirs(s.Layout.Root, s.Layout.WriteDirs(worker))
	finish := func() error {
		var have map[string]bool
		if made != nil {
			have = made()
		}
		dirs, err := ensureDirs(s.Client, s.Layout, worker, have)
		s.awaitRTT(rtt)
		if err != nil {
			return s.Deadline(err)
		}
		for _, d := range dirs {
			s.dirs.Store(d, struct{}{})
		}
		return nil
	}
	if made == nil {
		if err := finish(); err != nil {
			return fmt.Errorf("%w: %v", ErrNotPrepared, err)
		}
		return nil
	}
	prep := make(chan struct{})
	s.prep = prep
	go func() {
		defer close(prep)
		if err := finish(); err != nil {
			// the reason's text, not its kinds: a directory that could
			// not be made is no lost claim or missing file to a caller
			// asking IsNotExist of a rename
			s.prepErr = fmt.Errorf("%w: %v", ErrNotPrepared, err)
			s.prepFailed.Store(true)
		}
	}()
	return nil
}

// awaitRTT waits for Prepare's measure of the round trip, at most an op
// timeout and no longer than the session: a server that leaves the
// keepalive request unanswered (RFC 4254 has a server answer every
// global request that wants a reply; some do not), which nothing else
// bounds, leaves the round trip unmeasured (RTT 0) rather than the
// session waiting for good.
func (s *sitePrep) awaitRTT(rtt <-chan struct{}) {
	t := time.NewTimer(s.watch.timeout)
	defer t.Stop()
	select {
	case <-rtt:
	case <-s.done:
	case <-t.C:
	}
}

// ErrNotPrepared: the directories intake writes to on the site could not
// be made sure of (Prepared). The site's failure, not a file's: no file's
// attempt is counted for it.
var ErrNotPrepared = errors.New("the site's directories could not be made ready")

// preparing reports whether a preparation is under way.
func (s *sitePrep) preparing() bool {
	if s.prep == nil {
		return false
	}
	select {
	case <-s.prep:
		return false
	default:
		return true
	}
}

// Prepared waits for the preparation Prepare started, if any, and returns
// its error (ErrNotPrepared): the directories intake writes to could not
// be made sure of.
func (s *sitePrep) Prepared() error {
	if s.prep == nil {
		return nil
	}
	<-s.prep
	return s.prepErr
}

// Site resolves the session's site (one REALPATH round trip).
func (s *Session) Site() (partners.Site, error) {
	root, err := s.RealPath(s.Layout.Root)
	if err = s.Deadline(err); err != nil {
		return partners.Site{}, fmt.Errorf("realpath %s: %w", s.Layout.Root, err)
	}
	return partners.Site{HostKey: s.conn.hostFP, User: s.conn.user, Root: path.Clean(root)}, nil
}

// ResolveSite dials the partner's site and resolves it (intake check).
func ResolveSite(ctx context.Context, p *partners.Config) (partners.Site, error) {
	s, err := Dial(ctx, p)
	if err != nil {
		return partners.Site{}, err
	}
	defer s.Close()
	return s.Site()
}

// Dial connects to the partner's site with its pinned host key, on a
// connection of its own (Conns.Dial shares them).
func Dial(ctx context.Context, p *partners.Config) (*Session, error) { return unshared.Dial(ctx, p) }

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

// session opens the partner's channels on c and returns its session.
// Their start is bounded by deadline, the dial's: what is left of
// dial_timeout after the login, or for a session joining a connection,
// after its wait for the connection's first session. On
// expiry the session's channels are broken (a version exchange waiting
// for an sftp-server that does not start ends at once), the connection
// takes no new sessions, and it is closed if no other session is on it (a
// channel open sshd itself does not confirm then ends too; on a shared
// connection it ends when the connection's keepalive finds sshd hung).
func (c *sshConn) session(p *partners.Config, joined bool, deadline time.Time) (*Session, error) {
	watch := newWatchdog(p.SFTP.OpTimeout)
	packet := PacketSize(p.SFTP.MaxPacket, c.version)
	opts := []sftp.ClientOption{
		sftp.UseConcurrentReads(true),
		sftp.UseConcurrentWrites(true),
		// Never above the server's read limit: pkg/sftp#658 truncates
		// silently there (and the spool compares byte counts anyway).
		sftp.MaxPacketUnchecked(packet),
		sftp.MaxConcurrentRequestsPerFile(maxInFlight),
	}
	s := &Session{ssh: c.client, conn: c, joined: joined, watch: watch, partner: p.ID, done: make(chan struct{}), Layout: partners.NewLayout(p), packet: packet,
		listWatch: newWatchdog(p.SFTP.OpTimeout), opts: opts, rangeWatch: newWatchdog(p.SFTP.OpTimeout)}
	s.dirLister, s.sitePrep, s.wholeFiles = dirLister{s}, sitePrep{s}, wholeFiles{s}
	s.renamePolicy, s.siteProbes, s.chanBook = renamePolicy{s}, siteProbes{s}, chanBook{s}
	for _, w := range []*watchdog{s.watch, s.listWatch, s.rangeWatch} {
		w.conn = &c.heard
	}
	budget := time.Until(deadline)
	// The callback runs under mu, and the start ends under it too
	// (finish): a callback under way finishes before the caller leaves the
	// connection (sole counts this session until then).
	var (
		mu         sync.Mutex
		late, over bool
		lateC      = make(chan struct{}) // closed when late is set
	)
	timer := time.AfterFunc(budget, func() {
		mu.Lock()
		defer mu.Unlock()
		if over {
			return
		}
		late = true
		c.retire()
		s.abortChannels()
		if c.sole() {
			c.client.Close()
		}
		close(lateC)
	})
	// finish ends the start's timer and reports whether it fired.
	finish := func() bool {
		mu.Lock()
		defer mu.Unlock()
		over = true
		timer.Stop()
		return late
	}
	defer finish()
	// expired marks an error of a start the timer ended as a deadline's
	expired := func(err error) error {
		if finish() && !errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("no answer within %s (sftp.dial_timeout): %w: %w", p.SFTP.DialTimeout, os.ErrDeadlineExceeded, err)
		}
		return dialDeadline(err, p.SFTP.DialTimeout)
	}
	// The start runs on a goroutine of its own and is waited for until
	// the timer fires. A channel's open and its subsystem request are
	// SSH requests the site's sshd answers: closing the channel only asks
	// it to close, so on a connection other sessions keep (not closed
	// then) a site that answers neither, keepalives all the while, would
	// hold the start for good. Such a start is left to end with the
	// connection (it takes no new sessions); it can only fail (finish).
	type started struct {
		s   *Session
		err error
	}
	res := make(chan started, 1)
	go func() {
		s, err := c.startSession(s, p, joined, watch, finish, expired)
		res <- started{s, err}
	}()
	select {
	case r := <-res:
		return r.s, r.err
	case <-lateC:
		// the timer closed the client when the session was its only
		// one: the start then ends at once, with what the site did
		// (errOneSubsystem, learned by Dial); on a shared connection it
		// may never end
		select {
		case r := <-res:
			return nil, r.err // a late start always fails (finish)
		case <-time.After(lateGrace):
		}
		return nil, fmt.Errorf("partner %s: start sftp channels: %w", p.ID, expired(errors.New("the site did not answer the channels' open or subsystem requests")))
	}
}

// lateGrace is how long a late session start is waited for once its
// timer fired, for what it ended with.
const lateGrace = time.Second

// startSession opens the session's channels and starts SFTP on them
// (session, whose timer finish stops and expired reports).
func (c *sshConn) startSession(s *Session, p *partners.Config, joined bool, watch *watchdog, finish func() bool, expired func(error) error) (*Session, error) {
	// Both channels are opened at once: the first the site confirms
	// carries pkg/sftp, the other ListDir's listings (listdir.go). A site
	// that allows one channel (MaxSessions 1) confirms whichever came
	// first and refuses the other: the one confirmed is the main channel,
	// and listings go through pkg/sftp. At 50 ms that is three round
	// trips for both channels, not four (one after the other: six).
	type channel struct {
		ch  ssh.Channel
		err error
	}
	channels := 2
	if _, one := oneSubsystemSites.Load(strings.ToLower(p.SFTP.Address)); one {
		channels = 1
	}
	opens := make(chan channel, 2)
	for range channels {
		go func() {
			ch, err := c.openSession()
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
		return nil, fmt.Errorf("partner %s: open sftp channel: %w", p.ID, expired(primary.err))
	}
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
		c, err := s.startRaw(other.ch, s.listWatch)
		lister <- opened{c, err}
	}()
	sc, err := s.startSFTP(primary.ch, watch)
	l := <-lister
	if err != nil {
		s.abortChannels()
		if l.c != nil {
			// The site started SFTP on the listing channel and refused
			// it on the main one: a server that starts one subsystem a
			// connection, and took the two requests, sent together, the
			// other way round (Dial dials again with the main channel
			// alone).
			return nil, fmt.Errorf("partner %s: %w (%w)", p.ID, errOneSubsystem, err)
		}
		return nil, fmt.Errorf("partner %s: start sftp subsystem: %w", p.ID, expired(err))
	}
	if finish() {
		s.abortChannels()
		return nil, fmt.Errorf("partner %s: start sftp subsystem: %w", p.ID, expired(errors.New("the channels' start ended too late")))
	}
	c.upOnce.Do(func() { ready(c.raw) })
	if channels == 2 && l.err != nil {
		// the site refused this session's second channel: its channel
		// limit is reached, and no session joins the connection again
		// (its cap: the sessions up on it before this one); a session
		// that joined dials a connection of its own, and is not counted
		// up on this one
		c.pool.refused(c)
		if joined {
			s.abortChannels()
			return nil, fmt.Errorf("partner %s: the site refused a listing channel on a shared connection: %w", p.ID, l.err)
		}
	}
	c.pool.sessionUp(c, 1)
	s.Client, s.noLister = sc, l.err != nil
	if l.c != nil {
		s.install(l.c)
	}
	unwatch := watchAll(s.expire, watch, s.listWatch, s.rangeWatch)
	s.unwatch.Store(&unwatch)
	return s, nil
}

// inTime runs start, the start of a channel on an open session, and
// waits for it an op timeout at most. A channel's open and its subsystem
// request are SSH requests the site's sshd answers, which no watchdog
// counts (no SFTP request is pending yet): a site answering neither,
// keepalives all the while, would hold the caller (and the lock it
// holds) for good. Past the timeout the session ends as on a watchdog's
// expiry (its connection takes no new session, its calls fail) and the
// caller gets a *TimeoutError; what start returns later is let go (drop).
func inTime[T any](s *Session, start func() (T, error), drop func(T)) (T, error) {
	type started struct {
		v   T
		err error
	}
	var zero T
	select {
	case <-s.done:
		return zero, s.Deadline(errSessionClosed)
	default:
	}
	res := make(chan started, 1)
	go func() {
		v, err := start()
		res <- started{v, err}
	}()
	t := time.NewTimer(s.watch.timeout)
	defer t.Stop()
	select {
	case r := <-res:
		return r.v, r.err
	case <-t.C:
	}
	go func() {
		if r := <-res; r.err == nil {
			drop(r.v)
		}
	}()
	s.startLate.Store(true)
	s.conn.retire()
	go s.Close() // not under the caller's lock: Close takes the session's locks
	return zero, &TimeoutError{Partner: s.partner, After: s.watch.timeout, Err: errors.New("a channel's start went unanswered")}
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

// errSessionClosed is what the requests still in flight on a closed
// session get.
var errSessionClosed = errors.New("sftp: session closed")

// sessChan is one of the session's channels: the channel and its reader.
type sessChan struct {
	ch ssh.Channel
	r  *chanReader
}

// Close breaks the channel's reader at once and asks the site to close
// the channel (io.Closer, for the listing channel).
func (c *sessChan) Close() error {
	c.r.abort(errSessionClosed)
	c.ch.Close()
	return nil
}

// chanBook keeps the session's SFTP channels: those open, whose readers
// Close breaks, and the second channel large downloads read on (Ranges).
type chanBook struct{ *Session }

// track reads the channel through a chanReader the session can break. A
// channel opened after the session's channels were broken (closed, or its
// start too late) is broken at once.
func (s *chanBook) track(ch ssh.Channel, r *chanReader) *sessChan {
	c := &sessChan{ch: ch, r: r}
	s.chMu.Lock()
	aborted := s.aborted
	if !aborted {
		s.chans = append(s.chans, c)
	}
	s.chMu.Unlock()
	if aborted {
		c.Close()
	}
	return c
}

// untrack forgets a channel the session closed.
func (s *chanBook) untrack(c *sessChan) {
	s.chMu.Lock()
	defer s.chMu.Unlock()
	for i, o := range s.chans {
		if o == c {
			s.chans = append(s.chans[:i], s.chans[i+1:]...)
			return
		}
	}
}

// abortChannels breaks every channel of the session, and every channel
// opened later at once; it returns those it broke.
func (s *chanBook) abortChannels() []*sessChan {
	s.chMu.Lock()
	chans := s.chans
	s.chans, s.aborted = nil, true
	s.chMu.Unlock()
	for _, c := range chans {
		c.Close()
	}
	return chans
}

// newSFTP opens a channel and starts the sftp subsystem on it, as
// sftp.NewClient does, with the watchdog between the client and the
// channel.
func (s *chanBook) newSFTP(watch *watchdog) (*sftp.Client, error) {
	ch, err := s.conn.openSession()
	if err != nil {
		return nil, err
	}
	return s.startSFTP(ch, watch)
}

// startSFTP starts the sftp subsystem on an open channel; the channel is
// closed if that fails.
func (s *chanBook) startSFTP(ch ssh.Channel, watch *watchdog) (*sftp.Client, error) {
	c, pw, err := s.sftpSubsystem(ch, false)
	if err != nil {
		return nil, err
	}
	sc, err := sftp.NewClientPipe(watchedReader{w: watch, r: c.r}, watchedWriter{w: watch, wc: pw}, s.opts...)
	if err != nil {
		c.Close()
		s.untrack(c)
		return nil, err
	}
	return sc, nil
}

// sftpSubsystem opens ch's pipes, tracks it (track) and starts the sftp
// subsystem on it, for pkg/sftp's client and the raw listing channel
// alike (direct: its reader is read on the raw channel's own goroutine,
// chanreader.go); the channel is closed, and no longer tracked, if a step
// fails.
func (s *chanBook) sftpSubsystem(ch ssh.Channel, direct bool) (*sessChan, io.WriteCloser, error) {
	var cr *chanReader
	if direct {
		cr = newDirectReader(ch)
	} else {
		cr = newChanReader(ch)
	}
	c := s.track(ch, cr)
	if err := startSubsystem(ch); err != nil {
		c.Close()
		s.untrack(c)
		return nil, nil, err
	}
	w := &packetWriter{ch: ch}
	if s.conn.wholePackets() {
		w.sends = &s.conn.sends
	}
	return c, w, nil
}

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
		return partners.MinSFTPPacket
	}
	major, rest, _ := strings.Cut(v, ".")
	maj, err1 := strconv.Atoi(major)
	min, err2 := strconv.Atoi(leadingDigits(rest))
	if err1 != nil || err2 != nil || maj < 8 || (maj == 8 && min < 6) {
		return partners.MinSFTPPacket
	}
	return partners.MaxSFTPPacket
}

func leadingDigits(s string) string {
	for i, r := range s {
		if r < '0' || r > '9' {
			return s[:i]
		}
	}
	return s
}

// Ranges returns the session's second SFTP channel, opened on first use
// and kept, or nil when the server refuses one. A large download reads
// alternate ranges of the file on both channels (intake/download.go):
// x/crypto/ssh gives every channel a fixed 2 MiB receive window, so one
// channel carries at most 2 MiB per round trip (about 40 MB/s at 50 ms)
// whatever pkg/sftp keeps in flight; two carry twice that. Opened only
// when a large file comes, so a session of small files costs the site no
// second sftp-server.
func (s *chanBook) Ranges() *sftp.Client {
	s.rangeMu.Lock()
	defer s.rangeMu.Unlock()
	if s.ranges == nil && !s.noRanges.Load() {
		c, err := inTime(s.Session, func() (*sftp.Client, error) { return s.newSFTP(s.rangeWatch) }, func(c *sftp.Client) { c.Close() })
		if err != nil {
			var refused *ssh.OpenChannelError
			if errors.As(err, &refused) && !s.Stale() {
				s.conn.pool.refused(s.conn) // the site's channel limit is reached
			}
			s.noRanges.Store(true)
			return nil
		}
		s.ranges = c
	}
	return s.ranges
}

// RangesRefused reports whether the site refused the session's second
// channel (Ranges returns nil).
func (s *chanBook) RangesRefused() bool { return s.noRanges.Load() }

// Close ends the session: its channels' readers are broken at once (what
// is in flight fails), the site is asked to close them, and the session
// leaves its connection, the last one closing it (every channel ends with
// it at once). It is safe to call more than once, and never waits for the
// site:
//
//   - pkg/sftp's Close waits for a write under way, and a write the site
//     stopped taking (its channel window used up: a stuck sftp-server)
//     ends only with the connection; so on a connection other sessions
//     keep, the clients are closed on a goroutine of their own, and if a
//     write is still blocked an op timeout later the connection is closed
//     (the one case where one partner's failure reaches the others');
//   - a channel whose reader has not ended an op timeout after the close
//     (the site did not confirm it: its sftp-server is stuck) leaves the
//     connection taking no new sessions, so that it ends, and the stuck
//     channel with it, once its last session leaves.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		if unwatch := s.unwatch.Load(); unwatch != nil {
			(*unwatch)()
		}
		chans := s.abortChannels()
		s.conn.pool.sessionUp(s.conn, -1)
		last := s.conn.pool.leave(s.conn)
		closed := make(chan struct{})
		closeClients := func() {
			defer close(closed)
			s.rangeMu.Lock()
			if s.ranges != nil {
				s.ranges.Close()
			}
			s.rangeMu.Unlock()
			if s.Client != nil {
				s.Client.Close() // at once: its receive loop has ended
			}
		}
		if last {
			closeClients()
			return
		}
		go closeClients()
		go func() {
			t := time.NewTimer(s.watch.timeout)
			defer t.Stop()
			late := false
			for _, c := range chans {
				select {
				case <-c.r.done:
					continue
				case <-t.C:
					late = true
				}
				break
			}
			if late {
				s.conn.retire()
			} else {
				select {
				case <-closed:
					if !s.writing() {
						return
					}
					<-t.C
				case <-t.C:
				}
			}
			if s.writing() { // pkg/sftp's, or the listing channel's
				s.conn.client.Close()
			}
		}()
	})
	return nil
}

// expire ends the session when a request's deadline passed (the
// watchdog): the session is closed, and its connection takes no new
// sessions (the hung channel's server side ends with the connection, once
// the other sessions on it have left).
func (s *Session) expire() {
	s.conn.retire()
	s.Close()
}

// writing reports whether a write to one of the session's channels is
// under way.
func (s *Session) writing() bool {
	return s.watch.writing.Load() > 0 || s.listWatch.writing.Load() > 0 || s.rangeWatch.writing.Load() > 0
}

// Joined reports whether the session joined a connection another session
// dialled (it cost the site no login).
func (s *Session) Joined() bool { return s.joined }

// Stale reports whether the session should be given up and dialled
// afresh: its connection ended, or takes no new sessions (another
// session's channel on it hung), or the session was closed, or its
// preparation failed (Prepared).
func (s *Session) Stale() bool {
	select {
	case <-s.done:
		return true
	default:
	}
	return s.conn.dead() || s.conn.retiring.Load() || s.prepFailed.Load()
}

func authMethod(p *partners.Config) (ssh.AuthMethod, error) {
	s := p.SFTP
	switch {
	case s.PrivateKeyFile != "":
		b, err := os.ReadFile(s.PrivateKeyFile)
		if err != nil {
			return nil, fmt.Errorf("partner %s: sftp.private_key_file: %w", p.ID, err)
		}
		signer, err := ssh.ParsePrivateKey(b)
		if err == nil {
			signer, err = clientSigner(signer, s.LegacyAlgorithms)
		}
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
