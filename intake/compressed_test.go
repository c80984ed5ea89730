package intake_test

import (
	"archive/zip"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

func gz(t *testing.T, data []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(data)
	w.Close()
	return b.Bytes()
}

type zentry struct {
	name    string
	data    []byte
	symlink bool
}

func zipOf(t *testing.T, entries ...zentry) []byte {
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		if e.symlink {
			h.SetMode(os.ModeSymlink | 0o777)
		}
		f, err := w.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(e.data)
	}
	w.Close()
	return b.Bytes()
}

// Compressed files, good and hostile. Each hostile one is held with its
// exact reason, unparsed, nothing applied, and the partner's receipt says
// why; a partner whose feed takes no compression gets them held too; and
// another partner is served meanwhile.
func TestCompressedFiles(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "zips")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz|\.zip)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip, partners.CompressionZip}
	site.Config.Limits.MaxExpandedBytes = 1 << 20
	plain := testenv.NewSite(t, "plain")
	plain.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`

	good := []byte(testenv.OrdersCSV("Z", 5))
	bomb := make([]byte, 50<<20) // 50 MiB of zeros: about 50 KiB compressed
	cases := map[string]struct {
		data   []byte
		reason string
	}{
		"orders-good.csv.gz":     {gz(t, good), ""},
		"orders-good2.csv.zip":   {zipOf(t, zentry{name: "inner/orders.csv", data: []byte(testenv.OrdersCSV("Y", 4))}), ""},
		"orders-bomb.csv.zip":    {zipOf(t, zentry{name: "orders.csv", data: bomb}), "archive_too_large"},
		"orders-gzbomb.csv.gz":   {gz(t, bomb), "archive_too_large"},
		"orders-trav.csv.zip":    {zipOf(t, zentry{name: "../../etc/orders.csv", data: good}), "archive_bad_entry"},
		"orders-link.csv.zip":    {zipOf(t, zentry{name: "orders.csv", data: []byte("/etc/passwd"), symlink: true}), "archive_symlink"},
		"orders-two.csv.zip":     {zipOf(t, zentry{name: "a.csv", data: good}, zentry{name: "b.csv", data: good}), "archive_entries"},
		"orders-nest.csv.zip":    {zipOf(t, zentry{name: "inner.zip", data: zipOf(t, zentry{name: "a.csv", data: good})}), "archive_nested"},
		"orders-nestgz.csv.gz":   {gz(t, gz(t, good)), "archive_nested"},
		"orders-corrupt.csv.gz":  {append(gz(t, good)[:20], 0xde, 0xad), "archive_invalid"},
		"orders-notazip.csv.zip": {good, "archive_invalid"},
	}
	for name, c := range cases {
		site.Drop(t, name, string(c.data))
	}
	plain.Drop(t, "orders-p.csv.gz", string(gz(t, good)))
	plain.Drop(t, "orders-q.csv", testenv.OrdersCSV("Q", 2))

	r := newRig(t, pool, "w1", site, plain)
	r.poll("zips")
	r.poll("plain")

	for _, f := range files(t, pool, "zips") {
		c := cases[f.Name]
		if c.reason == "" {
			if f.State != "archived" {
				t.Fatalf("%s: %+v, want archived", f.Name, f)
			}
			continue
		}
		if f.State != "quarantined" || f.Reason != c.reason || f.Total != 0 {
			t.Fatalf("%s: %+v, want quarantined %s, unparsed", f.Name, f, c.reason)
		}
		if rc := receipt(t, site, f.Receipt); string(rc.Reason) != c.reason {
			t.Fatalf("%s: receipt %+v", f.Name, rc)
		}
	}
	if n := len(files(t, pool, "zips")); n != len(cases) {
		t.Fatalf("%d files processed, want %d", n, len(cases))
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'zips'`); n != 9 {
		t.Fatalf("%d rows, want the 5 + 4 rows of the two good archives", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'zips' AND order_id LIKE 'Z-%'`); n != 5 {
		t.Fatalf("%d Z rows", n)
	}
	for _, f := range files(t, pool, "plain") {
		want := map[string]string{"orders-p.csv.gz": "quarantined/compression_not_allowed", "orders-q.csv": "archived/"}[f.Name]
		if got := f.State + "/" + f.Reason; got != want {
			t.Fatalf("plain %s: got %s, want %s", f.Name, got, want)
		}
	}
	// the archive keeps the original (compressed) bytes
	var batch string
	for _, f := range files(t, pool, "zips") {
		if f.Name == "orders-good.csv.gz" {
			batch = f.Batch
			rel, _ := filepath.Rel(site.Root, f.Archive)
			if got := site.Read(t, rel); got != string(cases[f.Name].data) {
				t.Fatal("the archive does not hold the original compressed bytes")
			}
		}
	}
	if batch != "orders-good" {
		t.Fatalf("batch %q, want the stem without .csv.gz", batch)
	}
}
