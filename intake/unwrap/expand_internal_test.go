package unwrap

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"
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
