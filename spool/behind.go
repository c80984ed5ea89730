package spool

import (
	"io"
	"sync"
)

// Files of behindMin bytes and more are hashed and written behind the
// download; smaller ones are not worth a goroutine and buffers.
const (
	behindMin   = 4 << 20
	behindBuf   = 512 << 10
	behindDepth = 2
)

// buffers are reused across downloads; each is aligned for a write past
// the page cache (Direct).
var buffers = sync.Pool{New: func() any { b := alignedBuf(behindBuf)[:0]; return &b }}

// writesBehind reports whether a Put of want bytes (-1: not known) writes
// behind its source (newBehind): whole buffers of behindBuf bytes, but the
// last.
func writesBehind(want int64) bool { return want < 0 || want >= behindMin }

// behind hands the bytes written to it to one goroutine that writes them
// on (sha256 and the spool file), so the network side of a download
// (decrypting, reassembling SFTP replies) and the disk side run on
// different cores. At most depth buffers of size bytes are in flight:
// memory stays flat in file size. An error of the writer behind surfaces
// on a later Write or on Close.
type behind struct {
	full chan []byte
	free chan []byte
	cur  []byte
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func newBehind(w io.Writer, size, depth int) *behind {
	b := &behind{full: make(chan []byte, depth), free: make(chan []byte, depth+1), done: make(chan struct{})}
	for range depth + 1 {
		if size == behindBuf {
			b.free <- (*buffers.Get().(*[]byte))[:0]
		} else {
			b.free <- make([]byte, 0, size)
		}
	}
	b.cur = <-b.free
	go func() {
		defer close(b.done)
		defer func() {
			for range depth + 1 {
				if buf := <-b.free; cap(buf) == behindBuf {
					buffers.Put(&buf)
				}
			}
		}()
		for buf := range b.full {
			if b.failed() == nil {
				if _, err := w.Write(buf); err != nil {
					b.mu.Lock()
					b.err = err
					b.mu.Unlock()
				}
			}
			b.free <- buf[:0]
		}
	}()
	return b
}

func (b *behind) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *behind) Write(p []byte) (int, error) {
	if err := b.failed(); err != nil {
		return 0, err
	}
	n := len(p)
	for len(p) > 0 {
		k := copy(b.cur[len(b.cur):cap(b.cur)], p)
		b.cur, p = b.cur[:len(b.cur)+k], p[k:]
		if len(b.cur) == cap(b.cur) {
			b.full <- b.cur
			b.cur = <-b.free
		}
	}
	return n, nil
}

// Close writes what is buffered, waits for the writer behind and returns
// its error.
func (b *behind) Close() error {
	if len(b.cur) > 0 {
		b.full <- b.cur
	} else {
		b.free <- b.cur
	}
	b.cur = nil
	close(b.full)
	<-b.done
	return b.failed()
}
