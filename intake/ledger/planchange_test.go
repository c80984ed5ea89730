package ledger_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// A key prefix's range ends at the least text past every text that
// begins with it, byte-wise: what begins with the prefix is inside the
// range, and the texts around it are not.
func TestAKeyPrefixsRangeEndsPastEveryKeyItBegins(t *testing.T) {
	for _, c := range []struct {
		prefix, end string
		ok          bool
	}{
		{"K-1", "K-2", true},
		{"K-9", "K-:", true},
		{"a\U0010FFFF", "b", true},
		{"\uD7FF", "\uE000", true}, // past the surrogates
		{"\U0010FFFF\U0010FFFF", "", false},
		{"é", "ê", true},
	} {
		end, ok := ledger.PrefixEnd(c.prefix)
		if end != c.end || ok != c.ok {
			t.Errorf("PrefixEnd(%q) = %q, %v; want %q, %v", c.prefix, end, ok, c.end, c.ok)
			continue
		}
		if !ok {
			continue
		}
		for _, inside := range []string{c.prefix, c.prefix + "\x01", c.prefix + "\U0010FFFF\U0010FFFF"} {
			if !utf8.ValidString(end) || strings.Compare(inside, end) >= 0 {
				t.Errorf("%q is not below the end %q of prefix %q", inside, end, c.prefix)
			}
		}
		if strings.HasPrefix(end, c.prefix) {
			t.Errorf("the end %q of prefix %q begins with it", end, c.prefix)
		}
	}
}
