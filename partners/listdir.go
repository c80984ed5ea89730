package partners

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// ListDir streams the entries of a remote directory to fn, one READDIR
// reply at a time, and never holds the listing: pkg/sftp (v1.13) only
// offers ReadDir, which returns the whole directory as one slice, so a
// directory of a million entries would be a million FileInfos in memory.
// ListDir speaks the few SFTP v3 requests it needs (INIT, OPENDIR,
// READDIR, CLOSE) on a channel of its own over the session's SSH
// connection. "." and ".." are left out; attributes are as the server
// sends them (lstat-like on OpenSSH: a symlink shows as a symlink). An
// error from fn stops the listing and is returned. ctx ends the channel.
func (s *Session) ListDir(ctx context.Context, dir string, fn func(os.FileInfo) error) error {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	s.settleLister()
	if s.lister == nil && !s.noLister {
		c, err := s.openLister()
		if err != nil {
			s.noLister = true // a server that allows one channel only
		}
		s.lister = c
	}
	if s.noLister {
		return s.readDirWhole(ctx, dir, fn)
	}
	c := s.lister
	stop := context.AfterFunc(ctx, func() { c.ch.Close() })
	err := s.Deadline(c.list(dir, fn))
	if (err != nil && !c.clean) || !stop() {
		// the channel's state is unknown (a broken reply, ctx): a fresh
		// one next time
		s.dropLister()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	return nil
}

// settleLister waits for the replies the last listing left in flight
// (rawSFTP.drain); a channel one of them broke is closed, and the next
// listing opens a fresh one. listMu is held.
func (s *Session) settleLister() {
	if c := s.lister; c != nil && c.settle() != nil {
		s.dropLister()
	}
}

// dropLister closes the listing channel; the next listing opens a fresh
// one. What the channel had in flight is no longer waited for: the
// replies a listing left to drainReplies end with the channel (closed
// here, they fail at once once the site closes its side, or when the
// watchdog closes the connection), and only then is the watchdog's count
// of unanswered requests cleared, so that neither a dead request expires
// the session nor the drain's last reads upset the next channel's count.
// listMu is held.
func (s *Session) dropLister() {
	c := s.lister
	if c == nil {
		return
	}
	c.ch.Close()
	c.settle()
	s.listWatch.reset()
	s.lister = nil
}

// readDirWhole is ListDir on a server that refuses a second channel: the
// whole listing through pkg/sftp, unbounded (the session's error said so
// when it was dialled).
func (s *Session) readDirWhole(ctx context.Context, dir string, fn func(os.FileInfo) error) error {
	ents, err := s.Client.ReadDirContext(ctx, dir)
	if err = s.Deadline(err); err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range ents {
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// openLister opens the session's listing channel: the SFTP subsystem on a
// channel of its own, kept for the session's later listings.
func (s *Session) openLister() (*rawSFTP, error) {
	// a fresh stream: the watchdog's framing starts again, and requests
	// of a closed channel are no longer waited for
	s.listWatch.reset()
	return openRaw(s.ssh, s.listWatch)
}

// openRaw opens a channel, starts the SFTP subsystem on it and makes the
// version exchange; watch is the channel's watchdog.
func openRaw(client *ssh.Client, watch *watchdog) (*rawSFTP, error) {
	ch, err := client.NewSession()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	w, err := ch.StdinPipe()
	if err != nil {
		ch.Close()
		return nil, err
	}
	r, err := ch.StdoutPipe()
	if err != nil {
		ch.Close()
		return nil, err
	}
	if err := ch.RequestSubsystem("sftp"); err != nil {
		ch.Close()
		return nil, fmt.Errorf("sftp subsystem: %w", err)
	}
	c := &rawSFTP{ch: ch, w: watchedWriter{w: watch, wc: w}, r: watchedReader{w: watch, r: r}, watch: watch}
	if err := c.send(fxpInit, u32(3)); err != nil {
		ch.Close()
		return nil, err
	}
	if typ, _, err := c.recv(); err != nil || typ != fxpVersion {
		ch.Close()
		return nil, fmt.Errorf("sftp init: %v (reply type %d)", err, typ)
	}
	return c, nil
}

// EnsureDirsAtOnce makes sure of remote directories in as few round
// trips as the site allows: on the listing channel, a STAT of every
// directory, sent together (one round trip where they exist, as on every
// dial but a new site's first: no MKDIR is sent then); for those missing,
// an MKDIR of each and of each of its parents below root (parents first),
// then a STAT of each, sent together. OpenSSH's sftp-server answers
// requests one after another in the order they came, so each STAT sees
// what the MKDIRs before it made; an MKDIR of a directory that exists
// fails and changes nothing. It returns the directories the STATs showed
// as directories: the caller makes sure of the rest one by one (a site
// that answers out of order, or refuses a second channel, costs those
// round trips and nothing else). pkg/sftp's MkdirAll asks for a missing
// directory's parents one at a time: five round trips for
// processing/<worker>/ on a new site (docs/performance.md, item 44).
func (s *Session) EnsureDirsAtOnce(root string, rel []string) map[string]bool {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	s.settleLister()
	if s.lister == nil {
		return nil
	}
	c := s.lister
	ok, err := c.ensureDirs(root, rel)
	if err != nil && !c.clean {
		s.dropLister()
	}
	return ok
}

func (c *rawSFTP) ensureDirs(root string, rel []string) (map[string]bool, error) {
	c.clean = false
	var dirs []string
	parents := map[string][]string{} // each dir's MKDIRs, parents first
	for _, r := range rel {
		r = path.Clean(r)
		if r == "." || path.IsAbs(r) || r == ".." || strings.HasPrefix(r, "../") {
			continue // not below root: left to the caller
		}
		d := path.Join(root, r)
		parts := strings.Split(r, "/")
		for i := range parts {
			parents[d] = append(parents[d], path.Join(root, path.Join(parts[:i+1]...)))
		}
		dirs = append(dirs, d)
	}
	ok := map[string]bool{}
	if len(dirs) == 0 {
		c.clean = true
		return ok, nil
	}
	// the STATs alone first: where every directory exists (every dial
	// but a new site's first), nothing is asked to be made
	if err := c.statDirs(nil, dirs, ok); err != nil {
		return nil, err
	}
	var mk, missing []string
	seen := map[string]bool{}
	for _, d := range dirs {
		if ok[d] {
			continue
		}
		missing = append(missing, d)
		for _, p := range parents[d] {
			if !seen[p] {
				seen[p] = true
				mk = append(mk, p)
			}
		}
	}
	if len(missing) > 0 {
		if err := c.statDirs(mk, missing, ok); err != nil {
			return nil, err
		}
	}
	c.clean = true
	return ok, nil
}

// statDirs sends an MKDIR of each of mk, then a STAT of each of dirs, all
// at once, reads every reply, and marks in ok the dirs a STAT showed as
// directories.
func (c *rawSFTP) statDirs(mk, dirs []string, ok map[string]bool) error {
	c.clean = false
	var batch []byte
	first := c.id + 1
	for _, p := range mk {
		c.id++
		batch = appendPacket(batch, fxpMkdir, u32(c.id), str(p), u32(0))
	}
	statFrom := c.id + 1
	for _, d := range dirs {
		c.id++
		batch = appendPacket(batch, fxpStat, u32(c.id), str(d))
	}
	if _, err := c.w.Write(batch); err != nil {
		return err
	}
	for id := first; id <= c.id; id++ {
		typ, b, err := c.recv()
		if err != nil {
			return err
		}
		d := decoder{b: b}
		got := d.u32()
		if d.err != nil || got < first || got > c.id {
			return fmt.Errorf("sftp reply for request %d, want %d to %d", got, first, c.id)
		}
		if got >= statFrom && typ == fxpAttrs {
			if fi := d.attrs(""); d.err == nil && fi.mode.IsDir() {
				ok[dirs[got-statFrom]] = true
			}
		}
	}
	c.clean = true
	return nil
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

type rawSFTP struct {
	ch    io.Closer
	w     io.Writer
	r     io.Reader
	watch *watchdog
	id    uint32
	buf   []byte
	// clean: the last listing ended with the channel between requests
	// (its error came from fn or a status reply), so it can be used again
	clean bool
	// drain, while not nil, closes once the replies a listing left in
	// flight (a READDIR sent ahead, its CLOSE) are read, in the
	// background: the listing's caller does not wait a round trip for
	// them. broken: one of them did not come as it should.
	drain  chan struct{}
	broken bool
}

var errBrokenChannel = errors.New("sftp: a reply left in flight did not come as it should")

// settle waits for drain; an error means the channel cannot be used again.
func (c *rawSFTP) settle() error {
	if c.drain != nil {
		<-c.drain
		c.drain = nil
	}
	if c.broken {
		return errBrokenChannel
	}
	return nil
}

// drainReplies reads the replies of the n requests sent last (ids up to
// c.id) in the background; the last one must be a status OK (a CLOSE's).
func (c *rawSFTP) drainReplies(n int) {
	last := c.id
	first := last - uint32(n) + 1
	done := make(chan struct{})
	c.drain = done
	go func() {
		defer close(done)
		for id := first; ; id++ {
			typ, b, err := c.recv()
			d := decoder{b: b}
			if err != nil || d.u32() != id || d.err != nil {
				c.broken = true
				return
			}
			if id == last {
				if typ != fxpStatus || d.u32() != 0 {
					c.broken = true
				}
				return
			}
		}
	}()
}

func (c *rawSFTP) send(typ byte, body ...[]byte) error {
	_, err := c.w.Write(appendPacket(nil, typ, body...))
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
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 1 || n > maxListPacket {
		return 0, nil, fmt.Errorf("sftp reply of %d bytes", n)
	}
	if cap(c.buf) < int(n-1) {
		c.buf = make([]byte, n-1)
	}
	c.buf = c.buf[:n-1]
	if _, err := io.ReadFull(c.r, c.buf); err != nil {
		return 0, nil, err
	}
	return hdr[4], c.buf, nil
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func str(s string) []byte { return append(u32(uint32(len(s))), s...) }

// request sends a request with a fresh id and returns the reply's type and
// body after the id.
func (c *rawSFTP) request(typ byte, body ...[]byte) (byte, []byte, error) {
	c.id++
	if err := c.send(typ, append([][]byte{u32(c.id)}, body...)...); err != nil {
		return 0, nil, err
	}
	rt, b, err := c.recv()
	if err != nil {
		return 0, nil, err
	}
	d := decoder{b: b}
	if id := d.u32(); d.err != nil || id != c.id {
		return 0, nil, fmt.Errorf("sftp reply for request %d, want %d", id, c.id)
	}
	return rt, d.b, nil
}

// list lists dir: OPENDIR, then two READDIRs in flight at a time (the
// next batch, or the end, is on its way while one is read), and a CLOSE
// whose reply is not waited for (drainReplies). A directory that fits in
// one READDIR reply costs two round trips, not four.
func (c *rawSFTP) list(dir string, fn func(os.FileInfo) error) (err error) {
	c.clean = false
	typ, b, err := c.request(fxpOpendir, str(dir))
	if err != nil {
		return err
	}
	if typ != fxpHandle {
		c.clean = typ == fxpStatus
		return statusError(typ, b)
	}
	d := decoder{b: b}
	handle := d.str()
	if d.err != nil {
		return d.err
	}
	inFlight := 0
	readdir := func() error {
		c.id++
		inFlight++
		return c.send(fxpReaddir, u32(c.id), str(handle))
	}
	defer func() {
		c.id++
		if serr := c.send(fxpClose, u32(c.id), str(handle)); serr != nil {
			c.clean = false
			if err == nil {
				err = serr
			}
			return
		}
		if c.clean {
			c.drainReplies(inFlight + 1)
		}
	}()
	if err := readdir(); err != nil {
		return err
	}
	if err := readdir(); err != nil {
		return err
	}
	for want := c.id - 1; ; want++ {
		typ, b, err := c.recv()
		if err != nil {
			return err
		}
		inFlight--
		d := decoder{b: b}
		if id := d.u32(); d.err != nil || id != want {
			return fmt.Errorf("sftp reply for request %d, want %d", id, want)
		}
		c.clean = true // between replies: what is in flight is drained
		if typ == fxpStatus {
			if st := (decoder{b: d.b}); st.u32() == fxStatusEOF {
				return nil
			}
			return statusError(typ, d.b)
		}
		c.clean = false
		if typ != fxpName {
			return fmt.Errorf("sftp readdir: reply type %d", typ)
		}
		for n := d.u32(); n > 0 && d.err == nil; n-- {
			name := d.str()
			d.str() // longname
			fi := d.attrs(name)
			if d.err != nil {
				break
			}
			if name == "." || name == ".." {
				continue
			}
			err := fn(fi)
			// the time fn took is the caller's, not the site's: a
			// READDIR sent ahead is pending meanwhile, and the
			// watchdog must not count that time against the site
			c.watch.alive()
			if err != nil {
				c.clean = true
				return err
			}
		}
		if d.err != nil {
			return d.err
		}
		if err := readdir(); err != nil {
			return err
		}
	}
}

func statusError(typ byte, b []byte) error {
	if typ != fxpStatus {
		return fmt.Errorf("sftp: reply type %d", typ)
	}
	d := decoder{b: b}
	code := d.u32()
	msg := d.str()
	if code == 2 { // SSH_FX_NO_SUCH_FILE
		return fmt.Errorf("sftp: %s: %w", msg, os.ErrNotExist)
	}
	return fmt.Errorf("sftp status %d: %s", code, msg)
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
	fi := &entryInfo{name: path.Base(name), mode: os.ModeIrregular}
	flags := d.u32()
	if flags&attrSize != 0 {
		fi.size = int64(d.u64())
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
