package spool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// A follower reads exactly the bytes Put streams, while they stream, for
// small (written in place) and large (written behind) files alike, and
// past the page cache (Direct: a large file's whole blocks as they land,
// its last, short one at the end; a small file's through the cache).
func TestFollowerReadsWhatPutWrites(t *testing.T) {
	for _, c := range []struct {
		size int
		opts []PutOption
	}{{10, nil}, {6 << 20, nil}, {10, []PutOption{Direct()}}, {6<<20 + 123, []PutOption{Direct()}}} {
		size := c.size
		s, err := New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
		got := make(chan []byte, 1)
		var read atomic.Int64              // bytes the follower has read
		progress := make(chan struct{}, 1) // a read returned
		e, err := s.Put("acme", int64(size), 1<<30, func(w io.Writer) (int64, error) {
			// stream in pieces, each once the follower has read all
			// before it, so the follower has to wait for bytes
			var n int64
			for p := data; len(p) > 0; {
				k := min(len(p), 1<<20)
				m, err := w.Write(p[:k])
				n += int64(m)
				if err != nil {
					return n, err
				}
				p = p[k:]
				for read.Load() < n && len(p) > 0 {
					select {
					case <-progress:
					case <-time.After(10 * time.Second):
						return n, errors.New("the follower did not catch up")
					}
				}
			}
			return n, nil
		}, append(c.opts[:len(c.opts):len(c.opts)], Follow(func(fl *Follower) {
			go func() {
				var b []byte
				buf := make([]byte, 64<<10)
				for {
					k, err := fl.Read(buf)
					b = append(b, buf[:k]...)
					read.Add(int64(k))
					select {
					case progress <- struct{}{}:
					default:
					}
					if err != nil {
						break
					}
				}
				fl.Close()
				got <- b
			}()
		}))...)
		if err != nil {
			t.Fatal(err)
		}
		if b := <-got; !bytes.Equal(b, data) {
			t.Fatalf("size %d, %d options: follower read %d bytes (equal %v)", size, len(c.opts), len(b), bytes.Equal(b, data))
		}
		if b, err := os.ReadFile(s.Path("acme", e.SHA256)); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("size %d, %d options: the spool holds %d bytes (equal %v), %v", size, len(c.opts), len(b), bytes.Equal(b, data), err)
		}
		if e.Size != int64(size) {
			t.Fatalf("entry %+v", e)
		}
		noTemps(t, s, "acme")
	}
}

// A failed Put ends the follower with an error, not EOF (a partial file
// must never pass for a whole one); Close stops a waiting reader.
func TestFollowerSeesAFailedPutAndStopsOnClose(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shortPutFailsItsFollower(t, s)

	stopped := make(chan error, 1)
	release := make(chan struct{})
	put := make(chan struct{})
	go func() {
		defer close(put)
		s.Put("acme", -1, 1<<20, func(w io.Writer) (int64, error) {
			<-release
			return 0, nil
		}, Follow(func(fl *Follower) {
			go func() {
				_, err := fl.Read(make([]byte, 10))
				stopped <- err
			}()
			go fl.Close() // the read waits for bytes, or finds the follower closed: either way it stops
		}))
	}()
	if err := <-stopped; !errors.Is(err, ErrStopped) {
		t.Fatalf("read after Close: %v", err)
	}
	close(release)
	<-put // the Put's own clean-up ends before the test's temporary directory goes
}

// An Unkept put hands its bytes to its followers and writes none of them
// to the spool: each follower reads them whole, at its own pace, while
// the put holds no more than its window ahead of the slowest; a failed
// put ends them with its error; a follower closed early holds the put
// back no longer.
func TestAnUnkeptPutHandsItsBytesToItsFollowersAlone(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 6<<20+12345)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	sum := sha256.Sum256(data)
	var got [2]chan []byte
	var read [2]atomic.Int64
	var ahead atomic.Int64 // the most bytes written beyond what the slower follower had read
	var fls []*Follower
	// follower 1 is the slow one: it reads on only once follower 0 is
	// half a window ahead of it, or done
	moved, fastDone := make(chan struct{}, 1), make(chan struct{})
	behind := func() {
		for read[0].Load() < read[1].Load()+unkeptWindow/2 {
			select {
			case <-moved:
			case <-fastDone:
				return
			}
		}
	}
	e, err := s.Put("acme", -1, 1<<30, func(w io.Writer) (int64, error) {
		var n int64
		for p := data; len(p) > 0; {
			k := min(len(p), 100<<10)
			m, err := w.Write(p[:k])
			n += int64(m)
			if err != nil {
				return n, err
			}
			p = p[k:]
			// bytes still buffered before the writer are not the window's
			if d := n - min(read[0].Load(), read[1].Load()); d > ahead.Load() {
				ahead.Store(d)
			}
		}
		return n, nil
	}, Unkept(), Follow(func(fl *Follower) { fls = append(fls, fl) }), Follow(func(fl *Follower) { fls = append(fls, fl) }), Follow(func(fl *Follower) {
		for i, fl := range append(fls, fl)[:2] {
			got[i] = make(chan []byte, 1)
			go func() {
				var b []byte
				buf := make([]byte, 24<<10+i)
				for {
					k, err := fl.Read(buf)
					b = append(b, buf[:k]...)
					read[i].Add(int64(k))
					if i == 0 {
						select {
						case moved <- struct{}{}:
						default:
						}
					} else {
						behind()
					}
					if err != nil {
						if !errors.Is(err, io.EOF) {
							t.Errorf("follower %d: %v", i, err)
						}
						break
					}
				}
				if i == 0 {
					close(fastDone)
				}
				got[i] <- b
			}()
		}
		go fl.Close() // the third stops at once and holds nothing back
	}))
	if err != nil {
		t.Fatal(err)
	}
	if e.Size != int64(len(data)) || e.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("entry %+v, want the bytes' size and hash", e)
	}
	for i := range got {
		if b := <-got[i]; !bytes.Equal(b, data) {
			t.Fatalf("follower %d read %d bytes (equal %v)", i, len(b), bytes.Equal(b, data))
		}
	}
	// the behind writer's buffers (depth+1 of behindBuf) sit between the
	// source and the window
	if max := int64(unkeptWindow + (behindDepth+2)*behindBuf); ahead.Load() > max {
		t.Fatalf("the put ran %d bytes ahead of its slowest follower, want at most %d", ahead.Load(), max)
	}
	if s.Has("acme", e.SHA256, e.Size) {
		t.Fatal("the spool holds an unkept put's bytes")
	}
	if files, _ := filepath.Glob(filepath.Join(s.Dir(), "*", "*", "*")); len(files) != 0 {
		t.Fatalf("an unkept put left %v", files)
	}
	shortPutFailsItsFollower(t, s, Unkept())
}

// shortPutFailsItsFollower: a Put (with opts) that comes up short ends
// its follower with an error, not EOF.
func shortPutFailsItsFollower(t *testing.T, s *Spool, opts ...PutOption) {
	t.Helper()
	res := make(chan error, 1)
	_, err := s.Put("acme", 100, 1<<20, func(w io.Writer) (int64, error) {
		n, _ := w.Write([]byte("only ten b"))
		return int64(n), nil
	}, append(opts, Follow(func(fl *Follower) {
		go func() {
			_, err := io.ReadAll(fl)
			res <- err
		}()
	}))...)
	var short *ShortError
	if !errors.As(err, &short) {
		t.Fatalf("Put: %v", err)
	}
	if rerr := <-res; rerr == nil {
		t.Fatal("the follower of a short put read to a clean EOF")
	}
}
