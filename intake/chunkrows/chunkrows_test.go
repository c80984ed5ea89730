package chunkrows

import (
	"bytes"
	"hash/maphash"
	"testing"

	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/partners"
)

// textRows are rows without a target's binary encoders: COPY text.
func textRows() Rows {
	return Rows{seed: maphash.MakeSeed()}
}

// COPY text escapes what the format gives meaning to, writes NULL as \N,
// and lays out the staging payload (line first) and the target's (the
// partner first, the writer's intake id last); a repeated key marks the
// rows for the dedupe; streamed, the target's payload is the same bytes.
func TestTextPayloads(t *testing.T) {
	c := textRows()
	null := []bool{false, false}
	if err := c.Add(2, []string{"k1", "a\tb\\c\nd\re"}, null, []int{0}); err != nil {
		t.Fatal(err)
	}
	if c.DupKeys {
		t.Fatal("one row marked for the dedupe")
	}
	if err := c.Add(5, []string{"k1", ""}, []bool{false, true}, []int{0}); err != nil {
		t.Fatal(err)
	}
	if !c.DupKeys || c.Len() != 2 {
		t.Fatalf("dupKeys %v, %d rows", c.DupKeys, c.Len())
	}
	if got, want := string(c.StagePayload()), "2\tk1\ta\\tb\\\\c\\nd\\re\n5\tk1\t\\N\n"; got != want {
		t.Fatalf("stage payload %q, want %q", got, want)
	}
	want := "p\\t1\tk1\ta\\tb\\\\c\\nd\\re\t9\np\\t1\tk1\t\\N\t9\n"
	if got := string(c.DirectPayload("p\t1", 9)); got != want {
		t.Fatalf("direct payload %q, want %q", got, want)
	}
	var w bytes.Buffer
	if err := c.StreamDirect(&w, "p\t1", 9); err != nil || w.String() != want {
		t.Fatalf("streamed %q (%v), want %q", w.String(), err, want)
	}
	s := c.Subset([]int{1})
	if got := string(s.StagePayload()); got != "5\tk1\t\\N\n" {
		t.Fatalf("subset's stage payload %q", got)
	}
	c.Reset()
	if c.Len() != 0 || c.DupKeys || c.Keys.Len() != 0 || len(c.StagePayload()) != 0 {
		t.Fatalf("reset left %d rows, dupKeys %v, %d keys", c.Len(), c.DupKeys, c.Keys.Len())
	}
}

// A chunk holds at most chunk_rows rows and, unless one row alone is
// larger, at most chunk_bytes bytes of values; a rejected row carries no
// bytes into it.
func TestCutByRowsAndBytes(t *testing.T) {
	f := &partners.Feed{ChunkRows: 4, ChunkBytes: 10}
	row := func(v string) *rows.Row { return &rows.Row{Values: []string{v}} }
	var k Cut
	var got []int
	for _, r := range []*rows.Row{row("aaaa"), row("bbbb"), row("cc"), row("d"), row("e"), row("f"), row("g"),
		row("h"), {Issue: &rows.Issue{}}, row("iiiiiiiiiiii"), row("j")} {
		no, _ := k.Place(f, r)
		got = append(got, no)
	}
	// 10 bytes fill a chunk, the 11th opens the next; 4 rows do; the
	// rejected row adds no bytes; a 12-byte row alone
	want := []int{0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("chunks %v, want %v", got, want)
		}
	}
}
