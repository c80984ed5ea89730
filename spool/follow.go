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
// to stop early.
type Follower struct {
	f       *os.File
	mu      sync.Mutex
	cond    *sync.Cond
	written int64
	read    int64
	done    bool
	err     error // the Put's failure, once done
	closed  bool
}

// PutOption adjusts a Put.
type PutOption func(*putOptions)

type putOptions struct{ follow []func(*Follower) }

// Follow hands fn a Follower of the file being written, before any byte is
// streamed. fn must not block (start a goroutine). Each Follow option has
// a Follower of its own.
func Follow(fn func(*Follower)) PutOption {
	return func(o *putOptions) { o.follow = append(o.follow, fn) }
}

func newFollower(path string) (*Follower, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fl := &Follower{f: f}
	fl.cond = sync.NewCond(&fl.mu)
	return fl, nil
}

func (fl *Follower) advance(n int) {
	fl.mu.Lock()
	fl.written += int64(n)
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
