package partners_test

import (
	"bytes"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/partners"
)

// FuzzParseManifest: arbitrary bytes never panic the manifest parser; an
// accepted manifest has a sane size and a 64-digit lower-case hash.
func FuzzParseManifest(f *testing.F) {
	for _, seed := range []string{
		`{"bytes": 10, "sha256": "` + strings.Repeat("a", 64) + `", "batch_id": "b1", "rows": 3}`,
		`{"bytes": -1, "sha256": "x"}`,
		`{"bytes": 1, "sha256": "` + strings.Repeat("0", 64) + `", "extra": 1}`,
		`{"bytes": 1, "sha256": "` + strings.Repeat("0", 64) + `"} {}`,
		`[]`, ``, `{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := partners.ParseManifest(bytes.NewReader(data))
		if err != nil {
			return
		}
		if m.Bytes < 0 || len(m.SHA256) != 64 || strings.ToLower(m.SHA256) != m.SHA256 || (m.Rows != nil && *m.Rows < 0) {
			t.Fatalf("accepted %+v", m)
		}
	})
}

// FuzzSafeName: a name judged safe can be used as one remote path element
// and shows as it is: valid UTF-8, no separators, control or format
// characters, not . or .., at most 255 bytes; and classifying it never
// panics.
func FuzzSafeName(f *testing.F) {
	for _, seed := range []string{"orders-1.csv", "..", ".", "a/b", "a\\b", "x\x00", "\xff", "é.csv", strings.Repeat("a", 256), "\u0085x", "a\u202eb", "\u2028", "x\ufeff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if !partners.SafeName(name) {
			return
		}
		if !utf8.ValidString(name) || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\\") {
			t.Fatalf("%q judged safe", name)
		}
		for _, r := range name {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
				t.Fatalf("%q judged safe with control or format character %U", name, r)
			}
		}
	})
}
