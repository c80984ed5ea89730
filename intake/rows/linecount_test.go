package rows

import (
	"bufio"
	"bytes"
	"io"
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

// FuzzLineCounts: over any bytes, the lines the reader counts as it goes
// (the guard's, and those before the record to be read next, which a
// record too large is reported at) are the newlines of the bytes they
// stand for, read in reads of any size.
func FuzzLineCounts(f *testing.F) {
	for _, seed := range []string{
		hdr + "k1,42,3.10,01.02.2026,a,x@y.io\n",
		hdr + "\"k\n2\",1,1,,,\n\"a\"\"\nb\",2,2,,,\r\n",
		hdr + `k"x,1,1,,,` + "\nk2,\"1\"x\n,1\n",
		hdr + "k,1,1\n\n\n,,,,,,,,,,,,,,,,\n",
		"\uFEFF" + hdr + "k,1\n\n",
	} {
		f.Add([]byte(seed), uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		fd := feed(t)
		src := &stepReader{b: data, n: int(step%64) + 1}
		rd, err := NewReader(src, fd, 0)
		if err != nil {
			return
		}
		// the CSV reader's offsets are past a byte order mark, which the
		// reader skips before it
		body := data
		if fd.CSV.Encoding == partners.EncodingUTF8 {
			body = bytes.TrimPrefix(data, []byte("\uFEFF"))
		}
		for {
			_, err := rd.Next()
			// what the guard passed up: what the source gave, less what
			// the buffer under it holds yet
			passed := src.off - rd.guard.r.(*bufio.Reader).Buffered()
			if got, want := rd.guard.line, int64(bytes.Count(data[:passed], newline))+1; rd.guard.err == nil && got != want {
				t.Fatalf("the guard counts line %d after %d bytes, want %d", got, passed, want)
			}
			if off := rd.csv.InputOffset(); rd.rec.err == nil && int(off) <= len(body) {
				if got, want := rd.rec.next, int64(bytes.Count(body[:off], newline))+1; got != want {
					t.Fatalf("the next record starts on line %d at offset %d, want %d", got, off, want)
				}
			}
			if err != nil {
				return
			}
		}
	})
}

// stepReader reads b n bytes at a time.
type stepReader struct {
	b   []byte
	off int
	n   int
}

func (s *stepReader) Read(p []byte) (int, error) {
	if s.off == len(s.b) {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), s.n)], s.b[s.off:])
	s.off += k
	return k, nil
}
