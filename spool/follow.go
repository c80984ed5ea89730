package spool

import (
	"errors"
	"io"
	"os"
	"sync"
)

// ErrStopped is what a Follower reads after Close.
var ErrStopped = errors.New("spool: follower stopped")

// A Follower reads the bytes a Put is writing as they land in its file,
// waiting for more until the Put is done: a reader can validate a file
// while it downloads without ever slowing the download. It reads its own
// descriptor, so the Put may rename or remove the file meanwhile. Close it
// to stop early. The follower of an Unkept put reads the bytes from
// memory instead (unkept), and the put waits for it.
type Follower struct {
	f       *os.File
	dr      *directRead // f is read past the page cache (Direct)
	u       *unkept     // the Unkept put it follows; then f is nil
	mu      sync.Mutex
	cond    *sync.Cond
	written int64
	read    int64
	done    bool
	whole   bool  // every byte the Put writes is written (before its flush)
	err     error // the Put's failure, once done
	closed  bool
}

// PutOption adjusts a Put.
type PutOption func(*putOptions)

type putOptions struct {
	follow []func(*Follower)
	unkept bool
	direct bool
}

// Follow hands fn a Follower of the file being written, before any byte is
// streamed. fn must not block (start a goroutine). Each Follow option has
// a Follower of its own.
func Follow(fn func(*Follower)) PutOption {
	return func(o *putOptions) { o.follow = append(o.follow, fn) }
}

// Unkept has a Put hash the bytes and hand them to its followers without
// writing them to the spool: for bytes that are made again from what the
// spool keeps when they are needed later (a file's decrypted copy, read
// once as it streams). The Put waits for its slowest open follower, so
// memory stays at unkeptWindow (and the write-behind buffers before it)
// however far the follower falls behind. A follower must read to the end
// or be closed: one that stops reading holds the Put for good. The Entry
// it returns names bytes the spool does not hold (Has is false for it).
func Unkept() PutOption {
	return func(o *putOptions) { o.unkept = true }
}

// unkeptWindow is how many bytes an Unkept put holds for its followers.
const unkeptWindow = 256 << 10

// unkept is an Unkept put's window: the last bytes written, which its
// followers read at their own pace and the writer overwrites once every
// open follower has read them.
type unkept struct {
	mu      sync.Mutex
	cond    *sync.Cond
	buf     []byte
	written int64
	done    bool
	err     error
	fls     []*Follower
}

func newUnkept() *unkept {
	u := &unkept{buf: make([]byte, unkeptWindow)}
	u.cond = sync.NewCond(&u.mu)
	return u
}

func (u *unkept) follower() *Follower {
	fl := &Follower{u: u}
	u.fls = append(u.fls, fl)
	return fl
}

// held is the first byte an open follower has still to read (u.mu held).
func (u *unkept) held() int64 {
	low := u.written
	for _, fl := range u.fls {
		if !fl.closed && fl.read < low {
			low = fl.read
		}
	}
	return low
}

// Write copies p into the window as the followers free it. The bytes it
// copies to are read by no follower until written moves past them.
func (u *unkept) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		u.mu.Lock()
		for u.written-u.held() == int64(len(u.buf)) {
			u.cond.Wait()
		}
		free := int64(len(u.buf)) - (u.written - u.held())
		off := int(u.written % int64(len(u.buf)))
		u.mu.Unlock()
		k := copy(u.buf[off:off+int(min(free, int64(len(u.buf)-off)))], p)
		u.mu.Lock()
		u.written += int64(k)
		u.mu.Unlock()
		u.cond.Broadcast()
		p = p[k:]
	}
	return n, nil
}

func (u *unkept) finish(err error) {
	u.mu.Lock()
	u.done, u.err = true, err
	u.mu.Unlock()
	u.cond.Broadcast()
}

// read is Follower.Read for a follower of u.
func (u *unkept) read(fl *Follower, p []byte) (int, error) {
	u.mu.Lock()
	for fl.read >= u.written && !u.done && !fl.closed {
		u.cond.Wait()
	}
	switch {
	case fl.closed:
		u.mu.Unlock()
		return 0, ErrStopped
	case fl.read >= u.written:
		err := u.err
		u.mu.Unlock()
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	off := int(fl.read % int64(len(u.buf)))
	// copied under the lock: a Close meanwhile would free these bytes
	// for the writer
	k := copy(p, u.buf[off:min(off+int(u.written-fl.read), len(u.buf))])
	fl.read += int64(k)
	u.mu.Unlock()
	u.cond.Broadcast()
	return k, nil
}

func (u *unkept) close(fl *Follower) {
	u.mu.Lock()
	fl.closed = true
	u.mu.Unlock()
	u.cond.Broadcast()
}

// newFollower opens a follower of the file at path, read past the page
// cache when the Put writes it so (direct).
func newFollower(path string, direct bool) (*Follower, error) {
	f, direct, err := openFile(path, os.O_RDONLY, 0, direct)
	if err != nil {
		return nil, err
	}
	fl := &Follower{f: f}
	if direct {
		fl.dr = &directRead{buf: alignedBuf(directReadBuf), direct: true}
	}
	fl.cond = sync.NewCond(&fl.mu)
	return fl, nil
}

func (fl *Follower) advance(n int) {
	fl.mu.Lock()
	fl.written += int64(n)
	fl.mu.Unlock()
	fl.cond.Broadcast()
}

// writtenWhole tells the follower that the Put has written every byte it
// will (its flush and its move to the content name to come).
func (fl *Follower) writtenWhole() {
	fl.mu.Lock()
	fl.whole = true
	fl.mu.Unlock()
	fl.cond.Broadcast()
}

func (fl *Follower) finish(err error) {
	fl.mu.Lock()
	fl.done, fl.err = true, err
	fl.mu.Unlock()
	fl.cond.Broadcast()
}

func (fl *Follower) Read(p []byte) (int, error) {
	if fl.u != nil {
		return fl.u.read(fl, p)
	}
	if fl.dr != nil {
		return fl.readDirect(p)
	}
	fl.mu.Lock()
	for fl.read >= fl.written && !fl.done && !fl.closed {
		fl.cond.Wait()
	}
	switch {
	case fl.closed:
		fl.mu.Unlock()
		return 0, ErrStopped
	case fl.read >= fl.written:
		err := fl.err
		fl.mu.Unlock()
		if err == nil {
			err = io.EOF
		}
		return 0, err
	}
	avail, off := fl.written-fl.read, fl.read
	fl.mu.Unlock()
	if int64(len(p)) > avail {
		p = p[:avail]
	}
	n, err := fl.f.ReadAt(p, off)
	fl.mu.Lock()
	fl.read += int64(n)
	fl.mu.Unlock()
	if err == io.EOF && n == len(p) {
		err = nil
	}
	return n, err
}

// Close stops the follower; a Read waiting for bytes returns ErrStopped.
func (fl *Follower) Close() error {
	if fl.u != nil {
		fl.u.close(fl)
		return nil
	}
	fl.mu.Lock()
	already := fl.closed
	fl.closed = true
	fl.mu.Unlock()
	fl.cond.Broadcast()
	if already {
		return nil
	}
	return fl.f.Close()
}

// notifyWriter tells the followers about every byte written to the file.
type notifyWriter struct {
	w   io.Writer
	fls []*Follower
}

func (n *notifyWriter) Write(p []byte) (int, error) {
	k, err := n.w.Write(p)
	for _, fl := range n.fls {
		fl.advance(k)
	}
	return k, err
}
