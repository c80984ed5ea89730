package spool

import (
	"errors"
	"io"
	"os"
	"syscall"
	"unsafe"
)

// Direct has a Put write the file past the page cache (O_DIRECT, where
// the spool's filesystem takes it) and its followers read it back the
// same way: for bytes the spool keeps but reads once, as they land (the
// download of a file that is decrypted as it downloads), which would
// otherwise fill the page cache with a copy nothing reads again: on a
// virtual machine each page the kernel hands out for the first time
// costs a fault (docs/performance.md, "The ciphertext past the page
// cache"). Only a Put that writes behind its download (a file of
// behindMin bytes or more, its writes whole aligned buffers) goes past
// the cache; its last, short write and anything the filesystem refuses
// to take so go through it.
func Direct() PutOption {
	return func(o *putOptions) { o.direct = true }
}

// dioAlign is the alignment of a write or read past the page cache: of
// its buffer's address, its length and its file offset (the logical
// block of every disk Linux knows is at most 4 KiB).
const dioAlign = 4096

// alignedBuf is a buffer of n bytes whose first byte is dioAlign-aligned.
func alignedBuf(n int) []byte {
	b := make([]byte, n+dioAlign)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (dioAlign - 1))
	if off != 0 {
		off = dioAlign - off
	}
	return b[off : off+n : off+n]
}

// aligned reports whether p can be written or read past the page cache
// at a file offset that is.
func aligned(p []byte) bool {
	return len(p) > 0 && len(p)%dioAlign == 0 && uintptr(unsafe.Pointer(&p[0]))&(dioAlign-1) == 0
}

// directWriter writes a file opened past the page cache (openFile with
// direct), through it from the first write that is not whole aligned
// blocks, or that the filesystem refuses so (EINVAL), on.
type directWriter struct {
	f      *os.File
	direct bool
	off    int64 // bytes written so far
}

func (w *directWriter) Write(p []byte) (int, error) {
	if w.direct && (!aligned(p) || w.off%dioAlign != 0) {
		if err := w.buffered(); err != nil {
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	if w.direct && errors.Is(err, syscall.EINVAL) {
		// refused past the cache, at once or part way: the rest through it
		if berr := w.buffered(); berr != nil {
			return n, berr
		}
		var m int
		m, err = w.f.Write(p[n:])
		n += m
	}
	w.off += int64(n)
	return n, err
}

func (w *directWriter) buffered() error {
	w.direct = false
	return setBuffered(w.f)
}

// directReadBuf is how much a follower past the page cache reads at once.
const directReadBuf = 128 << 10

// directRead is a Follower's read past the page cache: whole aligned
// blocks of what the Put wrote, into a buffer of its own; the last, short
// block once the Put has written every byte.
type directRead struct {
	buf    []byte
	data   []byte // of buf, not read yet
	end    int64  // the file offset just past data
	direct bool   // the descriptor still reads past the page cache
}

// readDirect is Follower.Read past the page cache.
func (fl *Follower) readDirect(p []byte) (int, error) {
	d := fl.dr
	fl.mu.Lock()
	if fl.closed {
		fl.mu.Unlock()
		return 0, ErrStopped
	}
	if len(p) == 0 || len(d.data) > 0 {
		fl.mu.Unlock()
		n := copy(p, d.data)
		d.data = d.data[n:]
		return n, nil
	}
	// whole blocks as the Put writes them; its last one once the Put has
	// written every byte (whole), before its flush
	for !fl.closed && !fl.done && !fl.whole && fl.written&^(dioAlign-1) <= d.end {
		fl.cond.Wait()
	}
	closed, done, whole, written, ferr := fl.closed, fl.done, fl.whole, fl.written, fl.err
	fl.mu.Unlock()
	if closed {
		return 0, ErrStopped
	}
	limit := written &^ (dioAlign - 1)
	if done || whole {
		limit = written
	}
	if limit <= d.end {
		if whole && !done {
			// every byte read: the Put's end (its flush) says whether
			// they are the file
			fl.mu.Lock()
			for !fl.closed && !fl.done {
				fl.cond.Wait()
			}
			closed, ferr = fl.closed, fl.err
			fl.mu.Unlock()
			if closed {
				return 0, ErrStopped
			}
		}
		if ferr == nil {
			ferr = io.EOF
		}
		return 0, ferr
	}
	want := min(int64(len(d.buf)), (limit-d.end+dioAlign-1)&^(dioAlign-1))
	k, err := fl.f.ReadAt(d.buf[:want], d.end)
	if d.direct && k == 0 && errors.Is(err, syscall.EINVAL) {
		// the filesystem took O_DIRECT at the open but not this read
		d.direct = false
		if err = setBuffered(fl.f); err == nil {
			k, err = fl.f.ReadAt(d.buf[:want], d.end)
		}
	}
	k = int(min(int64(k), limit-d.end))
	switch {
	case k > 0:
		err = nil // a read past the end (the last block) is short
	case err == io.EOF:
		// the file is shorter than the Put wrote: never a clean end
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return 0, err
	}
	d.data, d.end = d.buf[:k], d.end+int64(k)
	n := copy(p, d.data)
	d.data = d.data[n:]
	return n, nil
}
