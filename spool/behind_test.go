package spool

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestBehindPassesEveryByteInOrder(t *testing.T) {
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(rand.IntN(256))
	}
	var out bytes.Buffer
	b := newBehind(&out, 64<<10, 3)
	for p := data; len(p) > 0; {
		k := min(len(p), 1+rand.IntN(200<<10)) // writes smaller and larger than a buffer
		if n, err := b.Write(p[:k]); n != k || err != nil {
			t.Fatalf("write %d: %d, %v", k, n, err)
		}
		p = p[k:]
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("got %d bytes, want %d (equal %v)", out.Len(), len(data), bytes.Equal(out.Bytes(), data))
	}
}

type failAfter struct{ left int }

var errDisk = errors.New("disk full")

func (f *failAfter) Write(p []byte) (int, error) {
	if f.left < len(p) {
		return 0, errDisk
	}
	f.left -= len(p)
	return len(p), nil
}

func TestBehindReportsTheWritersError(t *testing.T) {
	b := newBehind(&failAfter{left: 100 << 10}, 64<<10, 2)
	chunk := make([]byte, 32<<10)
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = b.Write(chunk)
	}
	cerr := b.Close()
	if !errors.Is(cerr, errDisk) {
		t.Fatalf("Close: %v, want the writer's error", cerr)
	}
	if werr != nil && !errors.Is(werr, errDisk) {
		t.Fatalf("Write: %v", werr)
	}
}
