package sftpconn

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
)

// dirLister lists directories: streamed on a listing channel of the
// session's own, or read whole through pkg/sftp where the server refuses
// that channel, leaving out names no directory can hold.
type dirLister struct{ *Session }

// ListDir streams the entries of a remote directory to fn, one READDIR
// reply at a time, and never holds the listing: pkg/sftp (v1.13) only
// offers ReadDir, which returns the whole directory as one slice, so a
// directory of a million entries would be a million FileInfos in memory.
// ListDir speaks the few SFTP v3 requests it needs (INIT, OPENDIR,
// READDIR, CLOSE, and STAT and MKDIR for EnsureDirsAtOnce, OPEN and WRITE
// for WholeFile) on a channel of its own over the session's SSH
// connection. Listings run side by side on
// that channel: each request has its id, and one reader hands every reply
// to its request, so two listings cost the round trips of one. "." and
// ".." are left out; attributes are as the server sends them
// (lstat-like on OpenSSH: a symlink shows as a symlink). An error from fn
// stops the listing and is returned. ctx ends the listing (not the
// channel, which other listings may share: what it left in flight is read
// and dropped).
func (s *dirLister) ListDir(ctx context.Context, dir string, fn func(os.FileInfo) error) error {
	if err := s.listDir(ctx, dir, fn, maxListNames); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("list %s: %w", dir, err)
	}
	return nil
}

// ReadDir lists a directory whole, as sftp.Client.ReadDir does, but on
// the listing channel (ListDir) where the site allows it: beside other
// listings, and in two round trips rather than pkg/sftp's four; under the
// session's deadline. Whole, as pkg/sftp's was, up to MaxReadDirEntries:
// for the directories its callers list (processing/ and the workers'
// dirs); the rest is streamed (ListDir).
func (s *Session) ReadDir(dir string) ([]os.FileInfo, error) {
	var ents []os.FileInfo
	err := s.listDir(context.Background(), dir, func(e os.FileInfo) error {
		if len(ents) == maxReadDirEntries {
			return fmt.Errorf("list %s: more than %d entries, more than a directory read whole may hold: %w", dir, maxReadDirEntries, ErrEndlessListing)
		}
		ents = append(ents, e)
		return nil
	}, maxReadDirEntries)
	if err != nil {
		return nil, err
	}
	return ents, nil
}

// listDir is ListDir and ReadDir: limit bounds a listing read whole
// through pkg/sftp (listDirOn).
func (s *dirLister) listDir(ctx context.Context, dir string, fn func(os.FileInfo) error, limit int) error {
	pending := s.preparing()
	n := 0
	count := func(e os.FileInfo) error { n++; return fn(e) }
	err := s.listDirOn(ctx, dir, count, limit)
	if n == 0 && s.vanish.Load() && IsNotExist(err) {
		return nil // a directory of a server that keeps none empty: empty (SetEmptyDirsVanish)
	}
	if err == nil || ctx.Err() != nil || !pending {
		return err
	}
	// A listing sent right behind Prepare's directories fails where they
	// could not be made: that is the reason to report. One that found
	// nothing where the preparation made the directory was answered
	// before it (a server that answers out of order, or the MKDIRs made
	// through pkg/sftp on another channel): listed again, once.
	if perr := s.Prepared(); perr != nil {
		return perr
	}
	if n == 0 && IsNotExist(err) {
		return s.listDirOn(ctx, dir, fn, limit)
	}
	return err
}

// listDirOn lists dir on the listing channel, or where the site allows one
// channel through pkg/sftp, whole and at most limit names.
func (s *dirLister) listDirOn(ctx context.Context, dir string, fn func(os.FileInfo) error, limit int) error {
	c := s.listChannel()
	if c == nil {
		// A site that refuses a second channel: the whole listing
		// through pkg/sftp, which holds it in memory. The names the
		// site's NAME replies announce are counted as they come and the
		// listing ends past limit ("." and ".." aside): a streamed
		// listing's bound (MaxListNames), a directory read whole's
		// (MaxReadDirEntries). One such listing at a time on the
		// session: the count is the channel's, and nothing else on it
		// brings NAME replies.
		s.wholeMu.Lock()
		defer s.wholeMu.Unlock()
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		end := s.watch.capNames(int64(limit)+2, wholeListingBytes, cancel)
		ents, err := s.Client.ReadDirContext(lctx, dir)
		if end() {
			return fmt.Errorf("sftp: more than %d names, more than %d bytes of them, or a reply of none, listed whole (the site allows one channel): %w",
				limit, wholeListingBytes, ErrEndlessListing)
		}
		if err = s.Deadline(err); err != nil {
			return err
		}
		for _, e := range ents {
			if err := s.possible(fn)(e); err != nil {
				return err
			}
		}
		return nil
	}
	return s.Deadline(c.list(ctx, dir, s.possible(fn)))
}

// possible hands fn what a listing may hold, both channels alike: a name
// no directory holds ("/", "a/../b", "", NUL: OneName) is left out and
// counted (TakeImpossibleNames), and an entry whose size no file has
// (2^63 bytes or more, negative once it is an int64) is irregular. pkg/sftp
// leaves out the names "." and "..", and passes path.Base of the rest: "/"
// stays "/", "" becomes "." ("a/../b" becomes "b", which no check can
// tell); the listing channel leaves "." and ".." out itself.
func (s *dirLister) possible(fn func(os.FileInfo) error) func(os.FileInfo) error {
	return func(e os.FileInfo) error {
		if name := e.Name(); !OneName(name) || name == "." || name == ".." {
			s.impossible.Add(1)
			return nil
		}
		if e.Size() < 0 {
			e = irregular{e}
		}
		return fn(e)
	}
}

// irregular is an entry whose size no file has: never taken for a
// regular file, nor read.
type irregular struct{ os.FileInfo }

func (irregular) Mode() os.FileMode { return os.ModeIrregular }
func (irregular) Size() int64       { return 0 }
func (irregular) IsDir() bool       { return false }

// TakeImpossibleNames returns how many names the site listed that no
// directory holds (OneName), left out of the session's listings since
// the last call.
func (s *dirLister) TakeImpossibleNames() int64 { return s.impossible.Swap(0) }

// listChannel is the session's listing channel, opened if it is not (nil:
// the site refuses a second channel). A channel that broke is dropped
// first (dropLocked).
func (s *dirLister) listChannel() *rawSFTP {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	if c := s.lister; c != nil && c.broken() != nil {
		s.dropLocked(c)
	}
	if s.lister == nil && !s.noLister {
		c, err := inTime(s.Session, s.openLister, func(c *rawSFTP) { c.fail(errSessionClosed) })
		if err != nil {
			s.noLister = true // a server that allows one channel only
		} else {
			s.install(c)
		}
	}
	return s.lister
}

// install makes c the session's listing channel, dropped as soon as its
// reader stops (the channel ended, or a reply broke it), whether or not a
// listing is under way: the watchdog's count then no longer holds what c
// left unanswered.
func (s *dirLister) install(c *rawSFTP) {
	s.lister = c
	c.whenStopped(func() {
		s.listMu.Lock()
		defer s.listMu.Unlock()
		if s.lister == c {
			s.dropLocked(c)
		}
	})
}

// dropLocked closes the listing channel c; the next listing opens a fresh
// one. The watchdog's count of unanswered requests is cleared once c's
// reader has stopped handing replies on and telling the watchdog (at
// once: fail) and its writers have stopped, so that neither a dead request
// expires the session nor c's last reads upset the next channel's count.
// A site that does not end the channel within the op timeout is hung: the
// session's connection then takes no new sessions, and what the channel
// holds ends with it. listMu is held.
func (s *dirLister) dropLocked(c *rawSFTP) {
	c.fail(errChannelDropped)
	<-c.done
	c.wmu.Lock()
	c.wmu.Unlock()
	s.listWatch.reset()
	s.lister = nil
	if sc, ok := c.ch.(*sessChan); ok {
		s.untrack(sc)
		go func() {
			select {
			case <-sc.r.done:
			case <-time.After(s.listWatch.timeout):
				s.conn.retire()
			}
		}()
	}
}

// openLister opens the session's listing channel: the SFTP subsystem on a
// channel of its own, kept for the session's later listings.
func (s *dirLister) openLister() (*rawSFTP, error) {
	// a fresh stream: the watchdog's framing starts again, and requests
	// of a closed channel are no longer waited for
	s.listWatch.reset()
	ch, err := s.conn.openSession()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	return s.startRaw(ch, s.listWatch)
}

// startRaw starts the SFTP subsystem on an open channel and makes the
// version exchange; the channel is closed if either fails. The exchange
// waits on the channel's reader like any request, so that the session
// breaking the channel (its close, its watchdog) ends it at once.
func (s *dirLister) startRaw(ch ssh.Channel, watch *watchdog) (*rawSFTP, error) {
	sc, w, err := s.sftpSubsystem(ch, true)
	if err != nil {
		return nil, fmt.Errorf("sftp subsystem: %w", err)
	}
	rd := &listReader{r: watchedReader{w: watch, r: sc.r}}
	c := &rawSFTP{ch: sc, w: watchedWriter{w: watch, wc: w}, r: rd, rd: rd, watch: watch,
		pending: map[uint32]chan reply{}, done: make(chan struct{})}
	sc.r.onAbort(c.fail) // the session breaks the channel: c fails at once
	version := make(chan error, 1)
	go c.read(version)
	if _, err = c.w.Write(appendPacket(nil, fxpInit, u32(3))); err != nil {
		c.fail(ended(err))
	}
	select {
	case err = <-version:
	case <-c.done:
		err = c.broken()
	}
	if err != nil {
		c.fail(err)
		s.untrack(sc)
		return nil, fmt.Errorf("sftp init: %w", err)
	}
	return c, nil
}

// listReader is the listing channel's reader: the channel itself, which
// tells the watchdog what it reads until the channel fails (detach). From
// then on the channel's reader only drains what still comes, and the
// watchdog is the next channel's.
type listReader struct {
	mu       sync.Mutex
	detached bool
	r        watchedReader
}

func (l *listReader) Read(p []byte) (int, error) {
	n, err := l.r.r.Read(p)
	if n > 0 {
		l.mu.Lock()
		if !l.detached {
			l.r.heard(p[:n])
		}
		l.mu.Unlock()
	}
	return n, err
}

// detach stops the reader telling the watchdog; it returns once no read
// does.
func (l *listReader) detach() {
	l.mu.Lock()
	l.detached = true
	l.mu.Unlock()
}

// sitePrep makes sure of the directories intake writes to on the site,
// once a session, on the listing channel where it can.
type sitePrep struct{ *Session }

// EnsureDirsAtOnce makes sure of remote directories in one round trip
// where the site allows (sendEnsureDirs), and returns the directories the
// site showed as directories: the caller makes sure of the rest one by
// one. nil: no listing channel.
func (s *sitePrep) EnsureDirsAtOnce(root string, rel []string) map[string]bool {
	if made := s.sendEnsureDirs(root, rel); made != nil {
		return made()
	}
	return nil
}

// sendEnsureDirs sends, on the listing channel and all at once, an MKDIR
// of every directory of rel below root and of each of its parents below
// root (parents first), then a STAT of each, and returns without waiting
// for the answers; made waits for them and returns the directories the
// STATs showed as directories (a site that answers out of order, or a
// name taken by a file, leaves some out: the caller makes sure of those
// one by one). OpenSSH's sftp-server answers a channel's requests one
// after another in the order they came, so each STAT, and each request
// sent after them (the poll's listings), sees what the MKDIRs before it
// made; an MKDIR of a directory that exists fails and changes nothing.
// So a site is made ready in one round trip whether it is new or not:
// pkg/sftp's MkdirAll asks for a missing directory's parents one at a
// time, five round trips for processing/<worker>/ on a new site
// (docs/performance.md, "SFTP requests written by hand"). nil: no
// listing channel, or the requests could not be sent.
func (s *sitePrep) sendEnsureDirs(root string, rel []string) (made func() map[string]bool) {
	c := s.listChannel()
	if c == nil {
		return nil
	}
	wait, err := c.ensureDirs(root, rel)
	if err != nil {
		return nil
	}
	return func() map[string]bool {
		ok, _ := wait()
		return ok
	}
}

func (c *rawSFTP) ensureDirs(root string, rel []string) (func() (map[string]bool, error), error) {
	var dirs, mk []string
	seen := map[string]bool{}
	for _, r := range rel {
		r = path.Clean(r)
		if r == "." || path.IsAbs(r) || r == ".." || strings.HasPrefix(r, "../") {
			continue // not below root: left to the caller
		}
		parts := strings.Split(r, "/")
		for i := range parts {
			if p := path.Join(root, path.Join(parts[:i+1]...)); !seen[p] {
				seen[p] = true
				mk = append(mk, p)
			}
		}
		dirs = append(dirs, path.Join(root, r))
	}
	if len(dirs) == 0 {
		return func() (map[string]bool, error) { return map[string]bool{}, nil }, nil
	}
	return c.statDirs(mk, dirs)
}

// statDirs sends an MKDIR of each of mk, then a STAT of each of dirs, all
// at once; wait reads every reply and returns the dirs a STAT showed as
// directories.
func (c *rawSFTP) statDirs(mk, dirs []string) (wait func() (map[string]bool, error), err error) {
	var replies []<-chan reply
	for _, p := range mk {
		r, err := c.start(fxpMkdir, str(p), u32(0))
		if err != nil {
			return nil, err
		}
		replies = append(replies, r)
	}
	for _, d := range dirs {
		r, err := c.start(fxpStat, str(d))
		if err != nil {
			return nil, err
		}
		replies = append(replies, r)
	}
	return func() (map[string]bool, error) {
		ok := map[string]bool{}
		var first error
		for i, r := range replies {
			rep := <-r // every reply is read, whatever came before
			if rep.err != nil {
				first = cmp.Or(first, rep.err)
				continue
			}
			if i >= len(mk) && rep.typ == fxpAttrs {
				d := decoder{b: rep.body}
				if fi := d.attrs(""); d.err == nil && fi.mode.IsDir() {
					ok[dirs[i-len(mk)]] = true
				}
			}
		}
		return ok, first
	}, nil
}

// SFTP v3 packet types and attribute flags (draft-ietf-secsh-filexfer-02).
const (
	fxpInit     = 1
	fxpVersion  = 2
	fxpClose    = 4
	fxpOpendir  = 11
	fxpReaddir  = 12
	fxpMkdir    = 14
	fxpStat     = 17
	fxpRename   = 18
	fxpStatus   = 101
	fxpHandle   = 102
	fxpName     = 104
	fxpAttrs    = 105
	fxStatusEOF = 1

	attrSize     = 0x1
	attrUIDGID   = 0x2
	attrPerms    = 0x4
	attrACModT   = 0x8
	attrExtended = 0x80000000

	// maxListPacket bounds one reply: OpenSSH's sftp-server sends at most
	// 256 KiB; a larger length is a broken or hostile server.
	maxListPacket = 1 << 20
)

// rawSFTP is an SFTP v3 channel shared by the requests of several
// callers at once: each request is written whole under wmu with the next
// id, and one reader (read) hands each reply to the request of its id.
// Requests the caller no longer waits for (a READDIR sent ahead, a CLOSE)
// are still read, so the watchdog's count stays true. The first reply
// that does not fit (an unknown id, a broken packet), the channel's end
// or the session breaking the channel fails every request in flight and
// every later one (broken): the session then opens a fresh channel. The
// reader reads the channel itself (a direct chanReader): after the
// failure it drains the channel until the site ends it, telling the
// watchdog nothing more.
type rawSFTP struct {
	ch    io.Closer
	w     io.Writer
	r     io.Reader
	rd    *listReader // r, detached at the failure
	watch *watchdog
	buf   []byte // the reader's

	wmu sync.Mutex // one request written at a time, ids in order
	id  uint32

	mu      sync.Mutex
	pending map[uint32]chan reply // requests written, not yet answered
	err     error                 // why the channel cannot be used again
	done    chan struct{}         // closed once the channel failed: no reply is handed on any more
	stopped func()                // whenStopped's, run once the channel failed
}

// whenStopped runs f, on a goroutine of its own, once the channel has
// failed (at once when it has already): nothing waits for it meanwhile (a
// fleet's idle sessions keep no goroutine for it).
func (c *rawSFTP) whenStopped(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		go f()
	default:
		c.stopped = f
	}
}

// reply is a request's reply: its type and what follows the id, or why
// none came.
type reply struct {
	typ  byte
	body []byte
	err  error
}

// A listing channel's own failures: every error of a request on it is
// one of these (channelFailure), the site's answer, or the session's
// closing (errSessionClosed).
var (
	errBrokenChannel  = errors.New("sftp: a reply did not come as it should")
	errChannelDropped = errors.New("sftp: the listing channel was closed") // by us, by the site, or with the connection
)

// read takes the version reply (told on version), then hands each reply
// to its request until the channel fails (it ends, a reply does not fit,
// or the session breaks it); then it drains the channel until the site
// ends it.
func (c *rawSFTP) read(version chan<- error) {
	defer io.Copy(io.Discard, c.r)
	typ, _, err := c.recv()
	if err == nil && typ != fxpVersion {
		err = fmt.Errorf("%w: reply type %d to the version request", errBrokenChannel, typ)
	}
	version <- err
	if err != nil {
		c.fail(err)
		return
	}
	for {
		typ, b, err := c.recv()
		if err == nil {
			d := decoder{b: b}
			id := d.u32()
			if err = d.err; err == nil {
				c.mu.Lock()
				r, ok := c.pending[id]
				delete(c.pending, id)
				failed := c.err != nil
				c.mu.Unlock()
				if failed {
					return // a reply after the failure: nobody waits for it
				}
				if ok {
					r <- reply{typ: typ, body: bytes.Clone(d.b)}
					continue
				}
				err = fmt.Errorf("%w: a reply for request %d, which is not in flight", errBrokenChannel, id)
			}
		}
		c.fail(err)
		return
	}
}

// fail makes the channel unusable for err: every request in flight gets
// it, every later one too, the reader hands nothing on and tells the
// watchdog nothing more, and the channel is closed (the reader drains it
// until the site ends it).
// What it keeps is the channel's own failure (channelFailure: a reply
// that did not fit is errBrokenChannel) or the session's closing.
func (c *rawSFTP) fail(err error) {
	if !channelFailure(err) && !errors.Is(err, errSessionClosed) {
		err = fmt.Errorf("%w: %w", errBrokenChannel, err)
	}
	c.mu.Lock()
	first := c.err == nil
	if first {
		c.err = err
		c.rd.detach() // before done: whoever waits for it may reset the watchdog
		close(c.done)
	}
	for id, r := range c.pending {
		r <- reply{err: c.err}
		delete(c.pending, id)
	}
	f := c.stopped
	c.stopped = nil
	c.mu.Unlock()
	if !first {
		return
	}
	c.ch.Close()
	if f != nil {
		go f()
	}
}

// broken is why the channel cannot be used again, or nil.
func (c *rawSFTP) broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// start writes a request with a fresh id; its reply comes on the channel
// returned.
func (c *rawSFTP) start(typ byte, body ...[]byte) (<-chan reply, error) {
	rs, err := c.startN(1, typ, body...)
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// startN writes n requests alike, each with a fresh id, in one write (one
// SSH packet, one system call); their replies come on the channels
// returned, in order.
func (c *rawSFTP) startN(n int, typ byte, body ...[]byte) ([]<-chan reply, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	rs := make([]<-chan reply, n)
	var p []byte
	for i := range rs {
		c.id++
		r := make(chan reply, 1)
		c.pending[c.id] = r
		rs[i] = r
		p = appendPacket(p, typ, append([][]byte{u32(c.id)}, body...)...)
	}
	c.mu.Unlock()
	if _, err := c.w.Write(p); err != nil {
		c.fail(ended(err))
		return nil, c.broken()
	}
	return rs, nil
}

// wait is a request's reply, or ctx's error once ctx ends first (the
// reply is then read and dropped when it comes).
func wait(ctx context.Context, r <-chan reply) reply {
	select {
	case rep := <-r:
		return rep
	case <-ctx.Done():
		return reply{err: ctx.Err()}
	}
}

// unexpected fails the channel for a reply of a type its request does
// not take.
func (c *rawSFTP) unexpected(what string, typ byte) error {
	err := fmt.Errorf("%w: %s: reply type %d", errBrokenChannel, what, typ)
	c.fail(err)
	return err
}

// appendPacket appends an SFTP packet to p.
func appendPacket(p []byte, typ byte, body ...[]byte) []byte {
	n := 1
	for _, b := range body {
		n += len(b)
	}
	p = binary.BigEndian.AppendUint32(p, uint32(n))
	p = append(p, typ)
	for _, b := range body {
		p = append(p, b...)
	}
	return p
}

func (c *rawSFTP) recv() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return 0, nil, ended(err)
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 1 || n > maxListPacket {
		return 0, nil, fmt.Errorf("%w: a reply of %d bytes", errBrokenChannel, n)
	}
	if cap(c.buf) < int(n-1) {
		c.buf = make([]byte, n-1)
	}
	c.buf = c.buf[:n-1]
	if _, err := io.ReadFull(c.r, c.buf); err != nil {
		return 0, nil, ended(err)
	}
	return hdr[4], c.buf, nil
}

// ended is a read or write error of the channel: the channel's own end
// (errChannelDropped), or the session's closing as it is.
func ended(err error) error {
	if errors.Is(err, errSessionClosed) {
		return err
	}
	return fmt.Errorf("%w: %w", errChannelDropped, err)
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func str(s string) []byte { return append(u32(uint32(len(s))), s...) }

// list lists dir: OPENDIR, then two READDIRs in flight at a time (the
// next batch, or the end, is on its way while one is read), and a CLOSE
// whose reply is not waited for (closeHandle). A directory that fits in
// one READDIR reply costs two round trips, not four.
func (c *rawSFTP) list(ctx context.Context, dir string, fn func(os.FileInfo) error) error {
	r, err := c.start(fxpOpendir, str(dir))
	if err != nil {
		return err
	}
	rep := wait(ctx, r)
	typ, b := rep.typ, rep.body
	if rep.err != nil {
		return rep.err
	}
	switch typ {
	case fxpHandle:
	case fxpStatus:
		return statusError(typ, b)
	default:
		return c.unexpected("opendir", typ)
	}
	d := decoder{b: b}
	handle := d.str()
	if d.err != nil {
		c.fail(d.err)
		return c.broken()
	}
	defer c.closeHandle(handle)
	// two READDIRs in flight, the first two in one write; after a reply
	// that held "." and ".." alone (an empty directory's first, as
	// OpenSSH sends it), one: the READDIR in flight most likely finds the
	// end, and an idle partner's listing makes one request less
	inflight, err := c.startN(2, fxpReaddir, str(handle))
	if err != nil {
		return err
	}
	var names, dots int // every name the site sent; "." and ".."
	for {
		rep := wait(ctx, inflight[0])
		inflight = inflight[1:]
		if rep.err != nil {
			return rep.err
		}
		if rep.typ == fxpStatus {
			if st := (decoder{b: rep.body}); st.u32() == fxStatusEOF {
				return nil
			}
			return statusError(rep.typ, rep.body)
		}
		if rep.typ != fxpName {
			return c.unexpected("readdir", rep.typ)
		}
		d := decoder{b: rep.body}
		n := d.u32()
		if n == 0 && d.err == nil {
			// OpenSSH ends a listing with an EOF status; a server that
			// answers every READDIR with no names would loop forever
			return c.unexpected("readdir: a reply with no names", rep.typ)
		}
		onlyDots := true
		for ; n > 0 && d.err == nil; n-- {
			name := d.str()
			d.str() // longname
			fi := d.attrs(name)
			if d.err != nil {
				break
			}
			if names++; names > maxListNames {
				return fmt.Errorf("sftp: more than %d names: %w", maxListNames, ErrEndlessListing)
			}
			if name == "." || name == ".." {
				// once each at most: a site that lists them again and
				// again never ends its listing (each reply renews the
				// watchdog, which only measures silence)
				if dots++; dots > 2 {
					return fmt.Errorf("sftp: %q listed again: %w", name, ErrEndlessListing)
				}
				continue
			}
			onlyDots = false
			err := fn(fi)
			// the time fn took is the caller's, not the site's: a
			// READDIR sent ahead is pending meanwhile, and the
			// watchdog must not count that time against the site
			c.watch.alive()
			if err != nil {
				return err
			}
		}
		if d.err != nil {
			c.fail(d.err)
			return c.broken()
		}
		want := 2
		if onlyDots {
			want = 1
		}
		if len(inflight) < want {
			more, err := c.startN(want-len(inflight), fxpReaddir, str(handle))
			if err != nil {
				return err
			}
			inflight = append(inflight, more...)
		}
	}
}

// closeHandle closes a handle without waiting for the reply. A reply of
// another type than a status fails the channel (a fresh one next time); a
// failed CLOSE of a directory handle leaves the stream as it was, and
// the channel is kept.
func (c *rawSFTP) closeHandle(handle string) {
	r, err := c.start(fxpClose, str(handle))
	if err != nil {
		return
	}
	go func() {
		if rep := <-r; rep.err == nil && rep.typ != fxpStatus {
			c.unexpected("close", rep.typ)
		}
	}()
}

func statusError(typ byte, b []byte) error {
	if typ != fxpStatus {
		return fmt.Errorf("sftp: reply type %d", typ)
	}
	d := decoder{b: b}
	code := d.u32()
	msg := siteText(d.str())
	switch code {
	case 2: // SSH_FX_NO_SUCH_FILE
		return fmt.Errorf("sftp: %s: %w", msg, os.ErrNotExist)
	case 3: // SSH_FX_PERMISSION_DENIED
		return fmt.Errorf("sftp: %s: %w", msg, os.ErrPermission)
	}
	return fmt.Errorf("sftp status %d: %s", code, msg)
}

// siteText is a message of the site's (an SFTP status's) as it may go
// into an error and a log line: at most 200 bytes, quoted with escapes
// when it holds anything but printable text (control characters, invalid
// UTF-8: a hostile server's message is not written out raw).
func siteText(msg string) string {
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	for _, r := range msg {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.QuoteToASCII(msg)
		}
	}
	return msg
}

type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("sftp: short reply")

func (d *decoder) u32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) u64() uint64 {
	hi := d.u32()
	return uint64(hi)<<32 | uint64(d.u32())
}

func (d *decoder) str() string {
	n := d.u32()
	if d.err != nil || uint32(len(d.b)) < n {
		d.err = errShort
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) attrs(name string) *entryInfo {
	fi := &entryInfo{name: name, mode: os.ModeIrregular}
	flags := d.u32()
	if flags&attrSize != 0 {
		fi.size = int64(d.u64()) // 2^63 or more is negative: Session.possible
	}
	if flags&attrUIDGID != 0 {
		d.u32()
		d.u32()
	}
	if flags&attrPerms != 0 {
		fi.mode = fileMode(d.u32())
	}
	if flags&attrACModT != 0 {
		d.u32()
		fi.mtime = time.Unix(int64(d.u32()), 0)
	}
	if flags&attrExtended != 0 {
		for n := d.u32(); n > 0 && d.err == nil; n-- {
			d.str()
			d.str()
		}
	}
	return fi
}

// MaxListNames bounds the names one listing passes ("." and "..", and
// names no directory holds, included): a site that sends names for ever,
// never the EOF status, fails the listing (ErrEndlessListing) instead of
// holding the partner's poll; each reply renews the watchdog, which only
// measures silence. No directory a site lists comes near it.
const MaxListNames = 10_000_000

// the limits in force (tests lower them)
var maxListNames, maxReadDirEntries, wholeListingBytes = MaxListNames, MaxReadDirEntries, int64(WholeListingBytes)

// MaxReadDirEntries bounds a listing read whole (ReadDir: processing/
// and its workers' directories, which hold the files in flight): a site
// listing more fails the call rather than the daemon's memory. What may
// be large (ready/, incoming/, reports/, quarantine/, archive/) is
// streamed (ListDir).
const MaxReadDirEntries = 100_000

// ErrEndlessListing: the site's listing would not end (it passed
// MaxListNames, or listed "." or ".." again).
var ErrEndlessListing = errors.New("a listing that does not end")

// OneName reports whether a listed name can be one entry of a directory:
// not empty, no '/' and no NUL, at most MaxNameBytes. A site that lists
// another ("/", "a/../b", a name of a megabyte) is broken or hostile: the
// entry is left out of the listing and counted
// (Session.TakeImpossibleNames), and no path of ours is built from it.
func OneName(name string) bool {
	return name != "" && len(name) <= MaxNameBytes && !strings.ContainsAny(name, "/\x00")
}

// MaxNameBytes is the longest name a listing passes on: no file system
// keeps a longer one (Linux and most keep 255 bytes; Windows 255 UTF-16
// units, 765 bytes of UTF-8). A listing's entries are bounded in number;
// this bounds them in bytes too (the poller keeps the oldest hostile
// entries of ready/, up to half of max_files_per_poll).
const MaxNameBytes = 1024

// WholeListingBytes bounds the NAME replies of one listing read whole
// through pkg/sftp (a site that allows one channel), which holds it in
// memory until its end: 64 MiB is about 400 000 entries of OpenSSH's.
const WholeListingBytes = 64 << 20

// fileMode converts POSIX mode bits; without them an entry is irregular
// (never taken for a regular file).
func fileMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	switch m & 0o170000 {
	case 0o100000:
	case 0o040000:
		mode |= os.ModeDir
	case 0o120000:
		mode |= os.ModeSymlink
	case 0o010000:
		mode |= os.ModeNamedPipe
	case 0o140000:
		mode |= os.ModeSocket
	case 0o020000:
		mode |= os.ModeDevice | os.ModeCharDevice
	case 0o060000:
		mode |= os.ModeDevice
	default:
		mode |= os.ModeIrregular
	}
	return mode
}

// entryInfo is one listed entry.
type entryInfo struct {
	name  string
	size  int64
	mode  os.FileMode
	mtime time.Time
}

func (e *entryInfo) Name() string       { return e.name }
func (e *entryInfo) Size() int64        { return e.size }
func (e *entryInfo) Mode() os.FileMode  { return e.mode }
func (e *entryInfo) ModTime() time.Time { return e.mtime }
func (e *entryInfo) IsDir() bool        { return e.mode.IsDir() }
func (e *entryInfo) Sys() any           { return nil }
