package ledger

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Text makes any error text one PostgreSQL takes as a text value: an HTTP
// status line quoted by Go keeps printable non-ASCII bytes, and a cut in
// the middle of a character (or a byte a server sent) made the statement
// fail with 22021, so the failure it recorded (a delivery's backoff, a
// file's next attempt) was never recorded.
func TestTextIsAlwaysAValidValueWithinItsBound(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 300, "plain"},
		{"x" + strings.Repeat("é", 200), 300, "x" + strings.Repeat("é", 149)}, // 299 bytes: the cut fell inside an é
		{"bad \xff byte", 300, "bad \uFFFD byte"},
		{"nul\x00inside", 300, "nulinside"},
	} {
		got := Text(c.in, c.max)
		if got != c.want || !utf8.ValidString(got) || len(got) > c.max {
			t.Errorf("Text(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}
