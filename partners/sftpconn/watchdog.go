package sftpconn

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

// A hung site must not hold a partner's poll, the reconciler or a purge
// forever: pkg/sftp's calls take no context and wait for their reply for
// good when the TCP connection stays open but nothing comes back (a frozen
// NAT, a stuck sftp-server; keepalives do not help against the latter, as
// sshd answers them itself). Breaking the session's channel readers ends
// such a call (chanreader.go: closing the SSH channel would not, and the
// connection may be other partners' too): pkg/sftp's receive loop then
// fails every request in flight (clientConn.broadcastErr) and refuses new
// ones. On expiry the watchdog ends its own session (Session.expire).
//
// The watchdog sits between pkg/sftp and the SSH channel and reads the
// SFTP packet framing both ways: every request gets exactly one reply, so
// it knows how many requests are unanswered. While any is, the site must
// send something within OpTimeout; every byte that comes back renews the
// deadline. A metadata call (READDIR, RENAME, STAT) thus has OpTimeout to
// answer, and a download or upload of any size is never cut while its
// bytes (or its WRITE acknowledgements) still arrive: the deadline is one
// of inactivity, not a total.

// TimeoutError: the site left an SFTP request unanswered for the partner's
// sftp.op_timeout, and the session was closed. errors.Is(err,
// os.ErrDeadlineExceeded) holds for it.
type TimeoutError struct {
	Partner string
	After   time.Duration
	Err     error // what the interrupted call returned
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("partner %s: the site left an SFTP request unanswered for %s (sftp.op_timeout); session closed: %v",
		e.Partner, e.After, e.Err)
}

func (e *TimeoutError) Unwrap() []error { return []error{os.ErrDeadlineExceeded, e.Err} }

// watchdog counts unanswered SFTP requests and ends its session when the
// site stays silent for timeout while one is pending.
type watchdog struct {
	timeout time.Duration
	pending atomic.Int64 // requests sent and not yet answered
	sentAll atomic.Int64 // requests sent in all
	last    atomic.Int64 // unix ns of the last sign of life: a reply byte, or the first request after a quiet spell
	expired atomic.Bool
	heard   atomic.Int64  // unix ns of the last reply byte
	trickle atomic.Int64  // reply bytes since the last sign of life, short of minProgress
	conn    *atomic.Int64 // the connection's last reply byte, on any channel (the keepalive's proof of life); nil in tests
	writing atomic.Int64  // writes under way (one blocked on a full window outlives the channel: Session.expire)
	// slack: silence allowed beyond timeout while a request that may take
	// long without a byte is pending (a RENAME that copies: allowSlow)
	slack atomic.Int64
	out   framer // only the writer touches it (pkg/sftp serialises its writes)
	in    framer // only the reader touches it (pkg/sftp's one receive loop)

	sentMu  sync.Mutex
	waiters []*sentWaiter // awaitSent's
	nwait   atomic.Int32  // len(waiters), read without the lock by every write

	names  atomic.Int64            // names the site's NAME replies announced so far (in.names)
	empty  atomic.Int64            // NAME replies that announced none (in.empty)
	nbytes atomic.Int64            // bytes of the NAME replies (in.nameBytes)
	capped atomic.Pointer[nameCap] // capNames'
}

// nameCap bounds the names a whole listing through pkg/sftp may bring
// (capNames).
type nameCap struct {
	base, limit         int64
	baseBytes, maxBytes int64
	baseEmpty           int64
	cancel              func()
	over                atomic.Bool
}

// capNames bounds the names the channel's NAME replies may announce from
// now on: past limit, or past maxBytes of NAME replies, cancel is called
// (it ends the listing's context).
// pkg/sftp reads a listing whole into memory, so a site that lists for
// ever would otherwise grow it until the daemon dies. The count covers
// every NAME reply on the channel meanwhile, so one bound at a time: its
// caller lists one whole listing at a time (Session.wholeMu). A NAME reply
// that announces no name passes the bound at once: pkg/sftp asks again
// after it, and a site answering so for ever (each reply renews the
// watchdog) kept the listing going for good, as the listing channel
// refuses it. end forgets the bound and reports whether it was passed.
func (w *watchdog) capNames(limit, maxBytes int64, cancel func()) (end func() (over bool)) {
	c := &nameCap{base: w.names.Load(), baseEmpty: w.empty.Load(), baseBytes: w.nbytes.Load(), limit: limit, maxBytes: maxBytes, cancel: cancel}
	w.capped.Store(c)
	return func() bool {
		w.capped.CompareAndSwap(c, nil)
		return c.over.Load()
	}
}

// sentWaiter is a caller waiting for a request of its own to be passed on
// to the channel (awaitSent).
type sentWaiter struct {
	match func([]byte) bool
	c     chan struct{}
}

// awaitSent returns a channel closed once a write passed on to the
// channel is a packet match accepts, and cancel, which forgets the wait.
// Whatever is written after that write goes out after it on the channel.
// match sees one Write: pkg/sftp (v1.13) writes a request as its header,
// then its payload if it has one (WRITE, SETSTAT, an OPEN with
// attributes); a RENAME has none, so it is one Write
// (TestARenameIsPassedOnInOneWrite). A request written in two never
// matches: its caller then waits for its answer instead (RenameAndOpen).
func (w *watchdog) awaitSent(match func([]byte) bool) (sent <-chan struct{}, cancel func()) {
	sw := &sentWaiter{match: match, c: make(chan struct{})}
	w.sentMu.Lock()
	w.waiters = append(w.waiters, sw)
	w.nwait.Add(1)
	w.sentMu.Unlock()
	return sw.c, func() { w.forget(sw) }
}

func (w *watchdog) forget(sw *sentWaiter) bool {
	w.sentMu.Lock()
	defer w.sentMu.Unlock()
	for i, o := range w.waiters {
		if o == sw {
			w.waiters = append(w.waiters[:i], w.waiters[i+1:]...)
			w.nwait.Add(-1)
			return true
		}
	}
	return false
}

// sent tells the waiters whose packet p is that it went out.
func (w *watchdog) sent(p []byte) {
	w.sentMu.Lock()
	var hit []*sentWaiter
	for _, sw := range w.waiters {
		if sw.match(p) {
			hit = append(hit, sw)
		}
	}
	w.sentMu.Unlock()
	for _, sw := range hit {
		if w.forget(sw) {
			close(sw.c)
		}
	}
}

func newWatchdog(timeout time.Duration) *watchdog {
	if timeout <= 0 { // a config that skipped SetDefaults
		timeout = partners.DefaultOpTimeout
	}
	w := &watchdog{timeout: timeout}
	w.last.Store(time.Now().UnixNano())
	return w
}

// reset forgets the stream's framing and pending requests (a new channel
// watched by the same watchdog; the old one is closed and nothing uses it).
func (w *watchdog) reset() {
	w.pending.Store(0)
	w.trickle.Store(0)
	w.out, w.in = framer{}, framer{}
	w.last.Store(time.Now().UnixNano())
}

// alive renews the deadline: the caller, not the site, took the time
// since the last sign of life (a listing's callback with a READDIR sent
// ahead). A nil watchdog does nothing.
func (w *watchdog) alive() {
	if w != nil {
		w.last.Store(time.Now().UnixNano())
	}
}

// watchers are the process's watched sessions, each cadence's checked by
// one goroutine and one ticker: a fleet's idle sessions, which share the
// op timeout, cost no goroutine each (docs/performance.md, the fleet's
// goroutines). A cadence's goroutine ends with its last session.
var watchers struct {
	mu   sync.Mutex
	sets map[time.Duration]*watchSet
}

// watchSet is one cadence's sessions (watchers.mu).
type watchSet struct {
	every   time.Duration
	members map[*watchEntry]struct{}
	ended   chan struct{} // closed with the set's last member leaving
}

// watchEntry is a session's watchdogs (its channels'), and what ends it.
type watchEntry struct {
	ws     []*watchdog
	expire func()
}

// watchAll checks a session's watchdogs four times per the shortest
// timeout among them until stop; the first that is due is marked expired,
// and expire (which ends the session) is called once, on a goroutine of
// its own.
func watchAll(expire func(), ws ...*watchdog) (stop func()) {
	every := time.Duration(0)
	for _, w := range ws {
		if d := max(w.timeout/4, 10*time.Millisecond); every == 0 || d < every {
			every = d
		}
	}
	e := &watchEntry{ws: ws, expire: expire}
	watchers.mu.Lock()
	if watchers.sets == nil {
		watchers.sets = map[time.Duration]*watchSet{}
	}
	set := watchers.sets[every]
	if set == nil {
		set = &watchSet{every: every, members: map[*watchEntry]struct{}{}, ended: make(chan struct{})}
		watchers.sets[every] = set
		go set.run()
	}
	set.members[e] = struct{}{}
	watchers.mu.Unlock()
	return func() {
		watchers.mu.Lock()
		set.leave(e)
		watchers.mu.Unlock()
	}
}

// leave takes e out of the set; the set's last member leaving ends it
// (watchers.mu).
func (s *watchSet) leave(e *watchEntry) {
	delete(s.members, e)
	if len(s.members) == 0 && watchers.sets[s.every] == s {
		delete(watchers.sets, s.every)
		close(s.ended)
	}
}

// run checks the set's sessions every tick until the set has ended.
func (s *watchSet) run() {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		var now time.Time
		select {
		case <-s.ended:
			return
		case now = <-t.C:
		}
		var due []*watchEntry
		watchers.mu.Lock()
		for e := range s.members {
			for _, w := range e.ws {
				if w.due(now) {
					w.expired.Store(true)
					due = append(due, e)
					s.leave(e)
					break
				}
			}
		}
		watchers.mu.Unlock()
		for _, e := range due {
			go e.expire()
		}
	}
}

// due reports whether a request has waited past the deadline at now.
func (w *watchdog) due(now time.Time) bool {
	return w.pending.Load() > 0 && now.UnixNano()-w.last.Load() > int64(w.timeout)+w.slack.Load()
}

// allowSlow lets the site stay silent for d beyond the timeout until the
// returned func is called (a RENAME the server makes as a copy: it answers
// once the bytes are copied). Calls nest: the largest allowance in force
// counts.
func (w *watchdog) allowSlow(d time.Duration) (done func()) {
	for {
		old := w.slack.Load()
		if int64(d) <= old || w.slack.CompareAndSwap(old, int64(d)) {
			break
		}
	}
	return func() {
		w.slack.CompareAndSwap(int64(d), 0)
	}
}

type watchedWriter struct {
	w  *watchdog
	wc io.WriteCloser
}

func (ww watchedWriter) Write(p []byte) (int, error) {
	// a request counts from its first bytes: one whose write blocks (the
	// site reads nothing) is under the deadline too
	if n, _ := ww.w.out.packets(p); n > 0 {
		if ww.w.pending.Load() == 0 {
			// the site has been quiet because nothing was asked: the
			// deadline starts now
			ww.w.last.Store(time.Now().UnixNano())
		}
		ww.w.pending.Add(int64(n))
		ww.w.sentAll.Add(int64(n))
	}
	ww.w.writing.Add(1)
	defer ww.w.writing.Add(-1)
	n, err := ww.wc.Write(p)
	if err == nil && ww.w.nwait.Load() > 0 {
		ww.w.sent(p)
	}
	return n, err
}

func (ww watchedWriter) Close() error { return ww.wc.Close() }

type watchedReader struct {
	w *watchdog
	r io.Reader
}

func (wr watchedReader) Read(p []byte) (int, error) {
	n, err := wr.r.Read(p)
	if n > 0 {
		wr.heard(p[:n])
	}
	return n, err
}

// heard tells the watchdog of reply bytes read.
func (wr watchedReader) heard(p []byte) {
	n := len(p)
	now := time.Now().UnixNano()
	wr.w.heard.Store(now)
	if wr.w.conn != nil {
		wr.w.conn.Store(now)
	}
	// a reply counts as answered at its last byte: one that stops
	// half way (a 255 KiB READ reply, say) is still waited for
	_, k := wr.w.in.packets(p)
	if k > 0 {
		wr.w.pending.Add(-int64(k))
	}
	if names, empty, nb := wr.w.in.names, wr.w.in.empty, wr.w.in.nameBytes; nb != wr.w.nbytes.Load() {
		wr.w.names.Store(names)
		wr.w.empty.Store(empty)
		wr.w.nbytes.Store(nb)
		if c := wr.w.capped.Load(); c != nil && (names-c.base > c.limit || empty > c.baseEmpty || nb-c.baseBytes > c.maxBytes) && !c.over.Swap(true) {
			c.cancel()
		}
	}
	// a sign of life is a reply that ended, or minProgress bytes of
	// one: a site that trickles a byte now and then (each within the
	// op timeout) would otherwise hold a request for as many op
	// timeouts as the reply has bytes
	if k > 0 || wr.w.trickle.Add(int64(n)) >= minProgress {
		wr.w.trickle.Store(0)
		wr.w.last.Store(now)
	}
}

// minProgress is the least of a reply that renews its deadline when no
// reply ends: 4 KiB an op timeout (68 bytes a second at the 60 s default)
// is far below any transfer that is moving.
const minProgress = 4 << 10

// framer follows SFTP packet framing (uint32 length, then that many
// bytes) across arbitrary splits of the byte stream.
type framer struct {
	hdr  [4]byte
	nhdr int
	left uint32
	// the first bytes of the packet under way: its type, its id and, for
	// a NAME reply, how many names it holds
	head      [9]byte
	nhead     int
	names     int64 // names the NAME packets so far announced
	empty     int64 // NAME packets that announced none
	nameBytes int64 // the NAME packets' lengths
	plen      uint32
}

// midPacket reports whether the bytes so far end inside a packet.
func (f *framer) midPacket() bool { return f.left > 0 || f.nhdr > 0 }

// packets reports how many packets start in b, and how many end in it.
func (f *framer) packets(b []byte) (starts, ends int) {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(uint32(len(b)), f.left)
			if f.nhead < len(f.head) {
				f.nhead += copy(f.head[f.nhead:], b[:k])
				if f.nhead == len(f.head) && f.head[0] == fxpName {
					n := int64(binary.BigEndian.Uint32(f.head[5:]))
					f.names += n
					f.nameBytes += int64(f.plen)
					if n == 0 {
						f.empty++
					}
				}
			}
			f.left -= k
			b = b[k:]
			if f.left == 0 {
				ends++
			}
			continue
		}
		c := copy(f.hdr[f.nhdr:], b)
		f.nhdr += c
		b = b[c:]
		if f.nhdr == len(f.hdr) {
			f.left = binary.BigEndian.Uint32(f.hdr[:])
			f.plen = f.left
			f.nhdr, f.nhead = 0, 0
			starts++
			if f.left == 0 {
				ends++
			}
		}
	}
	return starts, ends
}
