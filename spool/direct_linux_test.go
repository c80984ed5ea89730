package spool

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Direct put of a large file leaves its bytes out of the page cache
// (but its last, short write: here one page), its follower reading them
// back past it too, where the same put through the cache leaves them in;
// a short Direct put fails its follower as any put does.
func TestADirectPutLeavesItsBytesOutOfThePageCache(t *testing.T) {
	const size = 8<<20 + 5
	data := bytes.Repeat([]byte("fedcba9876543210"), size/16+1)[:size]
	resident := func(opts ...PutOption) (pages, of int) {
		s, err := New(diskDir(t))
		if err != nil {
			t.Fatal(err)
		}
		read := make(chan []byte, 1)
		e, err := s.Put("acme", size, 1<<30, func(w io.Writer) (int64, error) {
			n, err := w.Write(data)
			return int64(n), err
		}, append(opts, Follow(func(fl *Follower) {
			go func() {
				b, _ := io.ReadAll(fl)
				fl.Close()
				read <- b
			}()
		}))...)
		if err != nil {
			t.Fatal(err)
		}
		if b := <-read; !bytes.Equal(b, data) {
			t.Fatalf("%d options: the follower read %d bytes (equal %v)", len(opts), len(b), bytes.Equal(b, data))
		}
		pages, of = residentPages(t, s.Path("acme", e.SHA256))
		t.Logf("%d options: %d of %d pages in the page cache", len(opts), pages, of)
		return pages, of
	}
	if pages, of := resident(); pages < of/2 {
		t.Fatalf("a put through the cache left %d of its %d pages there: the count is off", pages, of)
	}
	if pages, _ := resident(Direct()); pages > 2 {
		t.Fatalf("a Direct put left %d pages in the page cache, want its last write's (one page) at most", pages)
	}

	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	_, err = s.Put("acme", size, 1<<30, func(w io.Writer) (int64, error) {
		n, err := w.Write(data[:5<<20+3])
		return int64(n), err
	}, Direct(), Follow(func(fl *Follower) {
		go func() {
			b, err := io.ReadAll(fl)
			if err == nil || !bytes.Equal(b, data[:len(b)]) {
				err = fmt.Errorf("read %d bytes (a prefix: %v), then %v", len(b), bytes.Equal(b, data[:len(b)]), err)
			} else {
				err = nil
			}
			res <- err
		}()
	}))
	var short *ShortError
	if !errors.As(err, &short) {
		t.Fatalf("Put: %v", err)
	}
	if err := <-res; err != nil {
		t.Fatalf("the follower of a short Direct put: %v", err)
	}
	noTemps(t, s, "acme")
}

// residentPages counts the pages of the file at path the page cache
// holds (mincore over a mapping of it, which faults none in).
func residentPages(t *testing.T, path string) (pages, of int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	ps := os.Getpagesize()
	vec := make([]byte, (len(m)+ps-1)/ps)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			pages++
		}
	}
	return pages, len(vec)
}

// diskDir is a temporary directory on a filesystem that keeps files on a
// disk: t.TempDir, unless that is tmpfs (a page cache alone, where a read
// or write past it still leaves the pages in memory), then one beside
// the package's sources.
func diskDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		return dir
	}
	dir, err := os.MkdirTemp(".", ".spool-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A follower past the page cache reads the last, short block once the
// put has written every byte (whole), before the put's flush and move
// end it, and then waits for that end: its error, or the clean end.
func TestADirectFollowerReadsTheLastBlockBeforeThePutsEnd(t *testing.T) {
	for _, putErr := range []error{nil, errors.New("flush failed")} {
		path := diskDir(t) + "/f"
		data := bytes.Repeat([]byte("0123456789"), 1000) // 10,000 bytes: two blocks and a short one
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fl, err := newFollower(path, true)
		if err != nil {
			t.Fatal(err)
		}
		if fl.dr == nil {
			t.Fatal("the follower does not read past the page cache")
		}
		fl.advance(len(data))
		fl.writtenWhole()
		got := make([]byte, len(data)+10)
		read := make(chan error, 1)
		var n int
		go func() {
			var err error
			n, err = io.ReadAtLeast(fl, got, len(data))
			read <- err
		}()
		select {
		case err = <-read:
		case <-time.After(time.Minute):
			t.Fatal("the last block was not read before the put's end")
		}
		if err != nil || !bytes.Equal(got[:n], data) {
			t.Fatalf("read %d bytes (equal %v), %v", n, bytes.Equal(got[:n], data), err)
		}
		end := make(chan error, 1)
		go func() {
			_, err := fl.Read(got)
			end <- err
		}()
		// the read waits for the put's end: its goroutine is seen
		// waiting, and has not ended
		for deadline := time.Now().Add(time.Minute); !waitingToRead(); {
			select {
			case err := <-end:
				t.Fatalf("the read after the last byte ended before the put did: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the read after the last byte is not seen waiting")
			}
			runtime.Gosched()
		}
		fl.finish(putErr)
		err = <-end
		if want := cmp.Or(putErr, io.EOF); err != want {
			t.Fatalf("the read after the put's end: %v, want %v", err, want)
		}
		fl.Close()
	}
}

// waitingToRead reports whether a goroutine waits in a follower's read
// past the page cache (readDirect, on its condition).
func waitingToRead() bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "sync.(*Cond).Wait") && strings.Contains(g, "(*Follower).readDirect") {
			return true
		}
	}
	return false
}
