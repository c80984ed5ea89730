package intake

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pkg/sftp"
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
		n, err := readSmall(f, tc.size)(&got)
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

// twoChannels hands the spool the file's bytes in order whatever order
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
			n, err := twoChannels(func(err error) error { return err }, f1, f2, size)(&got)
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
