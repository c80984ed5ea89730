package intake

import (
	"fmt"
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

func TestGroupAtTakesARunOfSmallPlainFilesOfOneFeed(t *testing.T) {
	p := &partners.Config{ID: "acme", Feeds: []partners.Feed{
		{Name: "orders", Pattern: `orders-.*\.csv(\.gz)?`, Compression: []string{partners.CompressionGzip}},
		{Name: "stock", Pattern: `stock-.*\.csv`},
	}}
	p.SetDefaults()
	p.GroupFiles = 4
	for i := range p.Feeds {
		p.Feeds[i].Columns = make([]partners.Column, 7) // 64 KiB holds at most 9363 rows: one chunk
	}
	orders, stock := &p.Feeds[0], &p.Feeds[1]
	c := func(name string, size int64) candidate {
		f := orders
		if name[:5] == "stock" {
			f = stock
		}
		return candidate{Name: name, Size: size, Feed: f}
	}
	names := func(g []candidate) string {
		s := ""
		for _, x := range g {
			s += x.Name + " "
		}
		return s
	}
	for _, tt := range []struct {
		cands []candidate
		n     int
		want  string
	}{
		{[]candidate{c("orders-1.csv", 100), c("orders-2.csv", 100)}, 100, "orders-1.csv orders-2.csv "},
		{[]candidate{c("orders-1.csv", 100)}, 100, ""}, // one file is no group
		{[]candidate{c("orders-1.csv", 100), c("orders-2.csv", 100), c("orders-3.csv", 100)}, 2, "orders-1.csv orders-2.csv "},
		{[]candidate{c("orders-1.csv", 1), c("orders-2.csv", 1), c("orders-3.csv", 1), c("orders-4.csv", 1), c("orders-5.csv", 1)}, 100, "orders-1.csv orders-2.csv orders-3.csv orders-4.csv "},
		{[]candidate{c("orders-1.csv", 100), c("stock-1.csv", 100), c("stock-2.csv", 100)}, 100, ""},                         // the feed changes
		{[]candidate{c("orders-1.csv", 100), c("orders-2.csv", 64<<10), c("orders-3.csv", 100)}, 100, ""},                    // not small
		{[]candidate{c("orders-1.csv", 100), c("orders-2.csv.gz", 100)}, 100, ""},                                            // compressed
		{[]candidate{c("orders-1.csv", 100), c("orders-1.csv.gz", 100), c("orders-2.csv", 100)}, 100, ""},                    // not after a compressed one
		{[]candidate{c("orders-1.csv", 0), c("orders-2.csv", 100)}, 100, ""},                                                 // empty
		{[]candidate{c("orders-a b.csv", 100), c("orders-2.csv", 100)}, 100, ""},                                             // no valid batch id
		{[]candidate{c("stock-1.csv", 100), c("stock-2.csv", 100), c("orders-3.csv", 100)}, 100, "stock-1.csv stock-2.csv "}, // stops at the feed change
	} {
		if got := names(groupAt(p, tt.cands, tt.n, false)); got != tt.want {
			t.Errorf("groupAt(%s, %d) = %q, want %q", names(tt.cands), tt.n, got, tt.want)
		}
	}
	// a group holds at most maxGroupBytes of files in memory
	var big []candidate
	for i := range 40 {
		big = append(big, c(fmt.Sprintf("orders-%d.csv", i), 60<<10))
	}
	p.GroupFiles = 64
	if g := groupAt(p, big, 100, false); len(g) != maxGroupBytes/(60<<10) {
		t.Fatalf("a group of %d files of 60 KiB, want %d", len(g), maxGroupBytes/(60<<10))
	}
	// nor a file that could hold more rows than one chunk
	p.Feeds[0].ChunkRows = 10
	p.Feeds[0].Columns = make([]partners.Column, 3)
	if g := groupAt(p, []candidate{c("orders-1.csv", 30), c("orders-2.csv", 31)}, 100, false); g != nil {
		t.Fatal("a file of 31 bytes, 3 columns and 10 rows a chunk was grouped")
	}
	if g := groupAt(p, []candidate{c("orders-1.csv", 30), c("orders-2.csv", 30)}, 100, false); len(g) != 2 {
		t.Fatal("files that fit one chunk were not grouped")
	}
	// a manifest pair never goes through a group
	m := c("orders-1.csv", 100)
	m.Manifest = "orders-1.csv.complete"
	if g := groupAt(p, []candidate{m, c("orders-2.csv", 100)}, 100, false); g != nil {
		t.Fatal("a file with a manifest was grouped")
	}
}
