package siteread

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// packetCounter counts the SFTP requests a client sends, by type (pkg/sftp
// writes each request in one Write: uint32 length, then the type byte).
type packetCounter struct {
	w     io.WriteCloser
	mu    sync.Mutex
	types map[byte]int
}

func (c *packetCounter) Write(p []byte) (int, error) {
	if len(p) > 4 {
		c.mu.Lock()
		c.types[p[4]]++
		c.mu.Unlock()
	}
	return c.w.Write(p)
}

func (c *packetCounter) Close() error { return c.w.Close() }

func (c *packetCounter) count(typ byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.types[typ]
}

const (
	fxpRead  = 5
	fxpFstat = 8
)

// pipeClient is a pkg/sftp client talking to pkg/sftp's server over pipes,
// serving the local file system.
func pipeClient(t *testing.T) (*sftp.Client, *packetCounter) {
	t.Helper()
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	srv, err := sftp.NewServer(struct {
		io.Reader
		io.WriteCloser
	}{sr, sw})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	pc := &packetCounter{w: cw, types: map[byte]int{}}
	c, err := sftp.NewClientPipe(cr, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// the pipes first: a client's Close waits for its reader to end
		sw.Close()
		cw.Close()
		c.Close()
		srv.Close()
	})
	return c, pc
}

func TestReadSmallReadsTheFileWithTwoReadsAndNoStat(t *testing.T) {
	c, pc := pipeClient(t)
	dir := t.TempDir()
	data := bytes.Repeat([]byte("order,1.00\n"), 100)
	for _, tc := range []struct {
		name   string
		onDisk []byte
		size   int64 // what the stat said
		want   int
	}{
		{"as stated", data, int64(len(data)), len(data)},
		{"empty", nil, 0, 0},
		// grew after the stat: read as longer than stated, so the spool's
		// byte count check refuses it instead of cutting it at the size
		{"grew", append(append([]byte{}, data...), "more\n"...), int64(len(data)), len(data) + 1},
	} {
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, tc.onDisk, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := c.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		reads, stats := pc.count(fxpRead), pc.count(fxpFstat)
		var got bytes.Buffer
		n, err := Small(f, tc.size)(&got)
		f.Close()
		if err != nil || n != int64(tc.want) || !bytes.Equal(got.Bytes(), tc.onDisk[:tc.want]) {
			t.Fatalf("%s: read %d bytes, %v; want the first %d", tc.name, n, err, tc.want)
		}
		if d := pc.count(fxpFstat) - stats; d != 0 {
			t.Fatalf("%s: %d FSTAT requests, want none (the caller has the size)", tc.name, d)
		}
		wantReads := 2 // the bytes, then the end
		if tc.size == 0 {
			wantReads = 1
		}
		if d := pc.count(fxpRead) - reads; tc.name != "grew" && d != wantReads {
			t.Fatalf("%s: %d READ requests, want %d", tc.name, d, wantReads)
		}
	}
}

// TwoChannels hands the spool the file's bytes in order whatever order
// its ranges arrive in, for sizes on and around range boundaries; a file
// that grew since the stat shows one byte longer, one that shrank fails.
func TestTwoChannelsStreamsTheRangesInOrder(t *testing.T) {
	c, _ := pipeClient(t)
	dir := t.TempDir()
	for _, size := range []int64{1, rangeBytes - 1, rangeBytes, rangeBytes + 1, 5*rangeBytes + 3} {
		data := make([]byte, size+7)
		for i := range data {
			data[i] = byte(i*7 + i/rangeBytes) // differs per range
		}
		for _, tc := range []struct {
			name   string
			onDisk []byte
			want   int64 // bytes handed on; -1: an error
		}{
			{"as stated", data[:size], size},
			{"grew", data, size + 1},
			{"shrank", data[:size-1], -1},
		} {
			p := filepath.Join(dir, fmt.Sprintf("%s-%d", tc.name, size))
			if err := os.WriteFile(p, tc.onDisk, 0o600); err != nil {
				t.Fatal(err)
			}
			f1, err := c.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			f2, err := c.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			n, err := TwoChannels(func(err error) error { return err }, f1, func() (File, error) { return f2, nil }, size)(&got)
			f1.Close()
			if tc.want < 0 {
				if err == nil {
					t.Fatalf("%s, %d bytes: no error for a file that shrank since the stat", tc.name, size)
				}
				continue
			}
			if err != nil || n != tc.want || !bytes.Equal(got.Bytes(), tc.onDisk[:tc.want]) {
				t.Fatalf("%s, %d bytes: handed on %d bytes (%v), want the first %d in order", tc.name, size, n, err, tc.want)
			}
		}
	}
}

// memFile is a File over bytes that counts its reads and records
// its close. With held set, its reads from heldFrom on wait until held is
// closed (at most 10 s); with first set, its first read closes first.
type memFile struct {
	data     []byte
	held     <-chan struct{}
	heldFrom int64
	first    chan struct{}
	once     sync.Once
	reads    atomic.Int64
	closed   atomic.Bool
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if f.held != nil && off >= f.heldFrom {
		select {
		case <-f.held:
		case <-time.After(10 * time.Second): // not forever: a download that never reads the other channel fails its test, not the run
		}
	}
	if f.first != nil {
		f.once.Do(func() { close(f.first) })
	}
	f.reads.Add(1)
	if off >= int64(len(f.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Close() error { f.closed.Store(true); return nil }

// A download read over two channels never waits for the second one: the
// main channel's readers read from the first byte, the second channel's
// join when it has the file open, and when it never opens it (a site
// that does not answer on it, or refuses it) the main channel reads every
// range. Whichever way, the bytes reach the writer whole and in order,
// and the second channel's file is closed.
func TestTwoChannelsNeverWaitForTheSecond(t *testing.T) {
	const size = 12*rangeBytes + 5
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i/rangeBytes)
	}
	check := func(name string, n int64, err error, got *bytes.Buffer) {
		t.Helper()
		if err != nil || n != size || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("%s: handed on %d bytes (%v), want %d in order", name, n, err, size)
		}
	}
	same := func(err error) error { return err }

	// the second channel never answers until the download is over
	f1 := &memFile{data: data}
	never := make(chan struct{})
	late := &memFile{data: data}
	var got bytes.Buffer
	n, err := TwoChannels(same, f1, func() (File, error) { <-never; return late, nil }, size)(&got)
	check("second channel silent", n, err, &got)
	close(never)
	waitFor(t, "the late second channel's file closed", late.closed.Load)
	if r := late.reads.Load(); r != 0 {
		t.Fatalf("the second channel, open after the download ended, read %d ranges", r)
	}

	// the second channel refused
	f1 = &memFile{data: data}
	got.Reset()
	n, err = TwoChannels(same, f1, func() (File, error) { return nil, errors.New("refused") }, size)(&got)
	check("second channel refused", n, err, &got)
	if r := f1.reads.Load(); r != 14 { // 13 ranges, then the READ at the end
		t.Fatalf("the main channel read %d times, want all 13 ranges and the end (14)", r)
	}

	// the second channel joins after the first two ranges were written:
	// it reads ranges too (the main channel is the slower: its reads after
	// the first two ranges wait for the second channel's first read)
	f2 := &memFile{data: data, first: make(chan struct{})}
	f1 = &memFile{data: data, held: f2.first, heldFrom: 2 * rangeBytes}
	open := make(chan struct{})
	got.Reset()
	w := &gateWriter{w: &got, after: 2 * rangeBytes, open: open}
	n, err = TwoChannels(same, f1, func() (File, error) { <-open; return f2, nil }, size)(w)
	check("second channel joins", n, err, &got)
	if f1.reads.Load() < 2 || f2.reads.Load() < 1 {
		t.Fatalf("reads: main channel %d, second %d; want both to read ranges", f1.reads.Load(), f2.reads.Load())
	}
	waitFor(t, "the second channel's file closed", f2.closed.Load)
}

// gateWriter writes to w, and once after bytes were written opens open.
type gateWriter struct {
	w     io.Writer
	after int
	n     int
	open  chan struct{}
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.n += len(p)
	if g.n >= g.after && g.open != nil {
		close(g.open)
		g.open = nil
	}
	return g.w.Write(p)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 5*time.Second, cond, testenv.Says(what))
}
