// Package siteread reads a claimed file's bytes off a partner's SFTP site
// as the spool takes them: a small file with one buffer of its size (two
// READs, no FSTAT), a large file from a far site in ranges over two SFTP
// channels of the session, whichever is free reading the next range,
// handed on in file order. Either way a READ past the stat's size must
// find the end, so a file that grew shows as longer. Which file is read
// how is the pipeline's (intake/download.go).
package siteread

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/spool"
)

// SmallBytes: a file below this size is read with one buffer of its
// size: a READ for its bytes and a READ of one byte past them, which
// must find the end, sent together (one round trip). One READ of size+1
// bytes would cost two: a server answers it with the file's bytes and
// pkg/sftp asks again for the rest, which is the end. pkg/sftp's WriteTo
// would first ask for the size again (one FSTAT more) and allocate a
// whole request's buffer (255 KiB) for a file of 1 KiB.
const SmallBytes = 64 << 10

// Small reads a file of size below SmallBytes. A file that grew since the
// stat shows as longer than expected (the byte past size is written
// too), not cut at it.
func Small(f *sftp.File, size int64) spool.Source {
	return func(w io.Writer) (int64, error) {
		buf := make([]byte, size)
		var past [1]byte
		var m int
		var errPast error
		done := make(chan struct{})
		go func() {
			defer close(done)
			m, errPast = f.ReadAt(past[:], size)
		}()
		n, err := f.ReadAt(buf, 0)
		<-done
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if errPast != nil && !errors.Is(errPast, io.EOF) {
			return 0, errPast
		}
		k, err := w.Write(buf[:n])
		if err != nil || m == 0 {
			return int64(k), err
		}
		j, err := w.Write(past[:m])
		return int64(k + j), err
	}
}

// SecondJoined counts the reads whose second channel opened the file
// and joined the read (tests).
var SecondJoined atomic.Int64

// rangeBytes is one range of a two-channel read. Four readers, two per
// channel, each read one range at a time into one of four buffers (4
// MiB in all): with two ranges (2 MiB, the channel's window) asked per
// channel, each channel keeps its window full while a reader waits for
// its next range's first reply. (Ranges of 2 MiB cost 16 MiB more peak
// RSS than one channel at 1M rows.) Six readers and eight buffers made
// the download at 50 ms faster and the file not: PostgreSQL's COPY ends
// the span (docs/performance.md).
const (
	rangeBytes   = 1 << 20
	rangeReaders = 4
)

// File is what TwoChannels reads: a file open on one channel.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// TwoChannels streams a file of size read as ranges, over f1, open on the
// session's main channel, and the file second opens on its second
// channel, into w in file order. Half the readers read on f1 from the
// start; the other half join on the second channel's file once second
// returns it (it blocks until then), and when it cannot open one, f1's
// readers read every range. Each reader takes a free buffer, then the
// next range no one has taken, so whichever channel is free reads it; the
// writer takes the ranges in order and gives their buffers back, so the
// readers are never more than rangeReaders ranges ahead of it. After the
// last range a READ at size must find the end: a file that grew shows as
// longer (one byte more), as Small's does. The second channel's file
// is closed once its readers are done.
func TwoChannels(deadline func(error) error, f1 File, second func() (File, error), size int64) spool.Source {
	return func(w io.Writer) (int64, error) {
		n := int64((size + rangeBytes - 1) / rangeBytes)
		type piece struct {
			buf []byte
			err error
		}
		out := make([]chan piece, n)
		for i := range out {
			out[i] = make(chan piece, 1)
		}
		stop := make(chan struct{})
		defer close(stop)
		free := make(chan []byte, rangeReaders)
		for range rangeReaders {
			free <- make([]byte, rangeBytes)
		}
		var next atomic.Int64 // the next range to take
		read := func(f File) {
			for {
				select {
				case <-stop: // the download ended: no range is read for nothing
					return
				default:
				}
				var buf []byte
				select {
				case buf = <-free:
				case <-stop:
					return
				}
				i := next.Add(1) - 1
				if i >= n {
					free <- buf
					return
				}
				off := i * rangeBytes
				want := min(int64(rangeBytes), size-off)
				m, err := f.ReadAt(buf[:want], off)
				if err == io.EOF && int64(m) == want {
					err = nil
				}
				if err == nil && int64(m) != want {
					err = io.ErrUnexpectedEOF // shrank since the stat
				}
				out[i] <- piece{buf: buf[:m], err: err}
				if err != nil {
					return
				}
			}
		}
		var readers sync.WaitGroup
		for range rangeReaders / 2 {
			readers.Go(func() { read(f1) })
		}
		go func() {
			f2, err := second()
			if err != nil {
				return
			}
			SecondJoined.Add(1)
			defer f2.Close()
			var more sync.WaitGroup
			for range rangeReaders - rangeReaders/2 {
				more.Go(func() { read(f2) })
			}
			more.Wait()
		}()
		var total int64
		for i := range n {
			p := <-out[i]
			if p.err != nil {
				return total, fmt.Errorf("read range %d: %w", i, deadline(p.err))
			}
			m, err := w.Write(p.buf)
			total += int64(m)
			if err != nil {
				return total, err
			}
			free <- p.buf[:cap(p.buf)]
		}
		readers.Wait()   // every range handed on: f1's readers are done before its READ at the end
		var past [1]byte // the end, where the stat put it
		m, err := f1.ReadAt(past[:], size)
		if m > 0 {
			k, werr := w.Write(past[:m])
			total += int64(k)
			if werr != nil {
				return total, werr
			}
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return total, deadline(err)
		}
		return total, nil
	}
}
