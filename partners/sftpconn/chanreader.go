package sftpconn

import (
	"io"
	"sync"
)

// A session's channels may share their SSH connection with other
// partners' sessions (conns.go), so the session cannot end a read the site
// never answers by closing the connection. Nor by closing the channel:
// x/crypto/ssh ends a channel's reads only when the site confirms the
// close, and OpenSSH confirms it only once the channel's sftp-server has
// exited — one stuck in open(2) on a FIFO, or on a hung network mount, never
// does (measured: a pending OPEN was still blocked 5 s after the close).
//
// chanReader reads a channel on a goroutine of its own and hands the bytes
// on through a pipe, which the session can break at once (abort): pkg/sftp's
// receive loop then fails every request in flight, as it does when the
// connection drops. The goroutine itself stays in the channel's Read until
// the site ends the channel or the connection closes; a connection that
// had a channel aborted takes no new sessions and is closed once its last
// session leaves (conns.go), so what a stuck channel holds ends with it.
//
// The listing channel's reader is intake's own (rawSFTP), which fails its
// requests itself when told (onAbort): its chanReader is direct, read on
// that reader's goroutine with no pump and no pipe (a goroutine and a
// hand-off less a partner: a fleet keeps one such channel a partner).
type chanReader struct {
	pr   *io.PipeReader // the pump's pipe; nil when direct
	r    io.Reader      // direct: the channel, read by its one reader
	done chan struct{}  // closed once the channel's own reads ended (the site ended it, or the connection closed)

	// direct: what abort tells the reader, and whether it was told
	mu      sync.Mutex
	aborted error
	hook    func(error)
	ended   sync.Once
}

// idleRead is what the pump reads into while the channel is quiet: an
// idle channel holds 512 bytes, not a bulk buffer (a fleet keeps two or
// three channels a partner open).
const idleRead = 512

// bulkReads are the buffers the pump reads a busy channel into.
var bulkReads = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func newChanReader(r io.Reader) *chanReader {
	pr, pw := io.Pipe()
	c := &chanReader{pr: pr, done: make(chan struct{})}
	go c.pump(r, pw)
	return c
}

// newDirectReader is a chanReader read on its reader's own goroutine.
func newDirectReader(r io.Reader) *chanReader {
	return &chanReader{r: r, done: make(chan struct{})}
}

// onAbort makes abort call f (direct only); at once when it was aborted
// already.
func (c *chanReader) onAbort(f func(error)) {
	c.mu.Lock()
	err := c.aborted
	if err == nil {
		c.hook = f
	}
	c.mu.Unlock()
	if err != nil {
		f(err)
	}
}

func (c *chanReader) pump(r io.Reader, pw *io.PipeWriter) {
	defer close(c.done)
	small := make([]byte, idleRead)
	buf := small
	var bulk *[]byte
	defer func() {
		if bulk != nil {
			bulkReads.Put(bulk)
		}
	}()
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := pw.Write(buf[:n]); werr != nil {
				// aborted: nothing reads on, but done tells when the
				// channel itself ended (the site confirmed its close, or
				// the connection closed)
				io.Copy(io.Discard, r)
				return
			}
		}
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		switch {
		case bulk == nil && n == len(buf):
			// a full read: more is waiting (a download)
			bulk = bulkReads.Get().(*[]byte)
			buf = *bulk
		case bulk != nil && n < len(buf)/8:
			bulkReads.Put(bulk)
			bulk, buf = nil, small
		}
	}
}

// Read reads what the channel sent, or the abort's error. A direct one
// reads the channel itself, abort or not (its reader stops using what it
// reads once told).
func (c *chanReader) Read(p []byte) (int, error) {
	if c.pr != nil {
		return c.pr.Read(p)
	}
	n, err := c.r.Read(p)
	if err != nil {
		c.ended.Do(func() { close(c.done) })
	}
	return n, err
}

// abort fails the reads waiting and every later one with err; a direct
// reader is told instead (onAbort).
func (c *chanReader) abort(err error) {
	if c.pr != nil {
		c.pr.CloseWithError(err)
		return
	}
	c.mu.Lock()
	f := c.hook
	if c.aborted == nil {
		c.aborted = err
	}
	c.hook = nil
	c.mu.Unlock()
	if f != nil {
		f(err)
	}
}
