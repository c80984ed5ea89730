package unwrap

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A gzip file of a feed that accepts gzip is expanded into the spool
// under its own hash; a file whose name declares no compression is its
// own data; a feed that does not accept gzip, an expansion past the
// ratio or the size cap, a gzip inside the gzip and bytes that are not
// gzip are held, each for its reason.
func TestRunExpandsOrHolds(t *testing.T) {
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	put := func(data []byte) spool.Entry {
		e, err := sp.Put("p1", -1, 1<<30, func(w io.Writer) (int64, error) {
			n, err := w.Write(data)
			return int64(n), err
		})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	rows := []byte("order_id,amount\n" + string(bytes.Repeat([]byte("1,2\n"), 1000)))
	gzFeed := &partners.Feed{Compression: []string{partners.CompressionGzip}}
	job := Job{Spool: sp, Partner: "p1", Feed: gzFeed, Name: "orders.csv.gz", MaxBytes: 1 << 20, MaxRatio: 1000}

	orig := put(gz(t, rows))
	e, held, err := job.Run(orig)
	if err != nil || held != nil || e.SHA256 == orig.SHA256 || e.Size != int64(len(rows)) {
		t.Fatalf("gzip: %+v %v %v", e, held, err)
	}
	plain := job
	plain.Name = "orders.csv"
	if e, held, err := plain.Run(orig); err != nil || held != nil || e != orig {
		t.Fatalf("no compression: %+v %v %v", e, held, err)
	}
	for _, c := range []struct {
		name string
		edit func(*Job)
		data []byte
		want reason.Code
	}{
		{"gzip not accepted", func(j *Job) { j.Feed = &partners.Feed{} }, gz(t, rows), reason.CompressionNotAllowed},
		{"past the ratio", func(j *Job) { j.MaxRatio = 2 }, gz(t, rows), reason.ArchiveTooLarge},
		{"past the size cap", func(j *Job) { j.MaxBytes = 100 }, gz(t, rows), reason.ArchiveTooLarge},
		{"nested", func(*Job) {}, gz(t, gz(t, rows)), reason.ArchiveNested},
		{"not gzip", func(*Job) {}, rows, reason.ArchiveInvalid},
	} {
		j := job
		c.edit(&j)
		var dropped []spool.Entry
		j.DropPlain = func(e spool.Entry) { dropped = append(dropped, e); sp.Remove(e.Partner, e.SHA256) }
		_, held, err := j.Run(put(c.data))
		if err != nil || held == nil || held.Reason != c.want || held.Detail == "" {
			t.Errorf("%s: held %+v, err %v; want %s", c.name, held, err, c.want)
		}
		if c.want == reason.ArchiveNested {
			// the expanded copy, spooled whole before it was seen to be
			// compressed, leaves the spool again
			inner := gz(t, rows)
			sum := sha256.Sum256(inner)
			if len(dropped) != 1 || dropped[0].SHA256 != hex.EncodeToString(sum[:]) || sp.Has("p1", dropped[0].SHA256, int64(len(inner))) {
				t.Errorf("%s: dropped %+v; want the expanded copy dropped from the spool", c.name, dropped)
			}
		}
	}
}
