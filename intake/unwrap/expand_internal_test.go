package unwrap

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

func zipWith(t *testing.T, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for i := range n {
		f, err := w.CreateHeader(&zip.FileHeader{Name: fmt.Sprintf("d/f%06d.csv", i), Method: zip.Store})
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte("x"))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A zip's directory is bounded from its end record before archive/zip
// reads it: too many entries (zip64 too), a directory over the byte bound,
// or one whose end record understates it (archive/zip would read on past
// the declared directory) are refused; an ordinary zip passes.
func TestZipDirectoryIsBoundedBeforeItIsRead(t *testing.T) {
	check := func(name string, data []byte, want reason.Code) {
		t.Helper()
		held, err := zipBounded(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got reason.Code
		if held != nil {
			got = held.Reason
		}
		if got != want {
			t.Fatalf("%s: got %q (%+v), want %q", name, got, held, want)
		}
	}
	check("one file", zipWith(t, 1), "")
	check("the most entries", zipWith(t, maxZipEntries), "")
	check("one entry too many", zipWith(t, maxZipEntries+1), reason.ArchiveDirectory)
	check("zip64 entry count", zipWith(t, 70000), reason.ArchiveDirectory)
	check("not a zip", []byte("order_id\n1\n"), "")

	// 5000 headers behind an end record that claims one entry of one
	// header's size: archive/zip would read all of them
	big := zipWith(t, 5000)
	e := bytes.LastIndex(big, []byte("PK\x05\x06"))
	dirOff := binary.LittleEndian.Uint32(big[e+16:])
	first := 46 + len("d/f000000.csv")
	binary.LittleEndian.PutUint16(big[e+8:], 1)
	binary.LittleEndian.PutUint16(big[e+10:], 1)
	binary.LittleEndian.PutUint32(big[e+12:], uint32(first))
	check("understated directory", big, reason.ArchiveInvalid)
	binary.LittleEndian.PutUint32(big[e+12:], uint32(e)-dirOff)
	check("directory over the byte bound", big, reason.ArchiveDirectory)
}

// diskReader reads data, but a read for which fails says so fails with
// err: the spool's disk failing under the spooled original.
type diskReader struct {
	r     *bytes.Reader
	calls int
	fails func(call int, off int64, n int) bool
	err   error
}

func (d *diskReader) ReadAt(p []byte, off int64) (int, error) {
	d.calls++
	if d.fails(d.calls, off, len(p)) {
		return 0, d.err
	}
	return d.r.ReadAt(p, off)
}

func (d *diskReader) Read(p []byte) (int, error) {
	off := d.r.Size() - int64(d.r.Len())
	d.calls++
	if d.fails(d.calls, off, len(p)) {
		return 0, d.err
	}
	return d.r.Read(p)
}

// A read of the spooled original that fails (the spool's disk) while an
// archive is opened is the job's error, to be retried, never the
// partner's corrupt archive (held archive_invalid): the gzip header, the
// zip's directory, the zip entry's local header.
func TestADiskErrorOpeningAnArchiveIsAnErrorNotAHold(t *testing.T) {
	eio := fmt.Errorf("read /spool/p1/sha256/ab/abcd: %w", syscall.EIO)
	var zb bytes.Buffer
	w := zip.NewWriter(&zb)
	f, _ := w.Create("orders.csv")
	f.Write([]byte("order_id,amount\n1,2\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	gzData := gz(t, []byte("order_id,amount\n1,2\n"))
	for _, c := range []struct {
		name  string
		kind  string
		data  []byte
		fails func(call int, off int64, n int) bool
	}{
		{"the gzip header", partners.CompressionGzip, gzData, func(int, int64, int) bool { return true }},
		{"the zip's directory", partners.CompressionZip, zb.Bytes(), func(call int, _ int64, _ int) bool { return call > 1 }},
		// the local header's 30 bytes at the entry's start (the first
		// read, of the zip's end, starts there too in a small zip)
		{"the zip entry's header", partners.CompressionZip, zb.Bytes(), func(_ int, off int64, n int) bool { return off == 0 && n == 30 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			job := Job{Feed: &partners.Feed{Compression: []string{c.kind}}, Name: "orders.csv." + map[string]string{partners.CompressionGzip: "gz", partners.CompressionZip: "zip"}[c.kind], MaxBytes: 1 << 20}
			orig := spool.Entry{Partner: "p1", SHA256: "ab", Size: int64(len(c.data))}
			_, held, err := job.expand(&diskReader{r: bytes.NewReader(c.data), fails: c.fails, err: eio}, c.kind, orig)
			if held != nil || !errors.Is(err, syscall.EIO) {
				t.Fatalf("held %+v, err %v; want the read's error", held, err)
			}
		})
	}
}

// What holds a file as a corrupt archive is the kind of the error, never
// its text: a spool write error whose path names a partner "deflate-labs"
// is the disk's.
func TestACorruptArchiveIsToldByTheErrorsKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("spool: stream: write /spool/deflate-labs/tmp/w1.x.part: %w", syscall.EIO), false},
		{fmt.Errorf("spool: stream: %w", flate.CorruptInputError(12)), true},
		{fmt.Errorf("spool: stream: %w", gzip.ErrChecksum), true},
		{fmt.Errorf("spool: stream: %w", io.ErrUnexpectedEOF), true},
	} {
		if got := corrupt(c.err); got != c.want {
			t.Errorf("corrupt(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
