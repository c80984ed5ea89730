package inert

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"orders-1.csv", "orders-1.csv"},
		{"Bestellung für Zürich €.csv", "Bestellung für Zürich €.csv"},
		{"注文 2024.csv", "注文 2024.csv"},
		{"a b\u00a0c", "a b\u00a0c"}, // spaces are printable
		{"\ufffd", "\ufffd"},         // U+FFFD written as such
		{"K-1\x1b[1A\x1b[2Kdeletes 0", `K-1\x1b[1A\x1b[2Kdeletes 0`},
		{"a\tb\nc\rd", `a\tb\nc\rd`},
		{"nul\x00del\x7f", `nul\x00del\x7f`},
		{"bad\xff.part", `bad\xff.part`},
		{"\xe2\x80", `\xe2\x80`}, // a truncated sequence: each byte
		{"c1\u0085\u009b", `c1\u0085\u009b`},
		{"invoice-\u202egpj.exe", `invoice-\u202egpj.exe`},
		{"\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069", `\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069`},
		{"zero\u200bwidth\u200d\ufeff", `zero\u200bwidth\u200d\ufeff`},
		{"line\u2028para\u2029", `line\u2028para\u2029`},
		{"tag\U000e0041", `tag\U000e0041`},
		{`back\slash`, `back\\slash`},
		{`\x1b`, `\\x1b`}, // the escape's text is not the escape
	} {
		if got := Text(c.in); got != c.want {
			t.Errorf("Text(%q) = %q, want %q", c.in, got, c.want)
		}
		if Printable(c.in) != (c.in == c.want) {
			t.Errorf("Printable(%q) = %v", c.in, Printable(c.in))
		}
	}
}

func TestQuoteAndLines(t *testing.T) {
	if got, want := Quote(`a "b"`+"\x1b"), `"a \"b\"\x1b"`; got != want {
		t.Errorf("Quote = %s, want %s", got, want)
	}
	if got, want := Quote(""), `""`; got != want {
		t.Errorf("Quote(\"\") = %s", got)
	}
	if got, want := Lines("partner a: x\x1b\npartner b: \xff"), "partner a: x\\x1b\npartner b: \\xff"; got != want {
		t.Errorf("Lines = %q, want %q", got, want)
	}
}

// TestTextProperties: for random strings of bytes and of runes of every
// kind, Text is valid UTF-8 without a control, format, line or paragraph
// separator character, leaves printable text as it is, and can be read
// back to the original (no two texts share a form).
func TestTextProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pool := []rune{'a', 'Z', '0', ' ', '\\', '"', 'x', 'u', '\x1b', '\x00', '\n', '\t', '\x7f', '\u0085', '\u009b',
		'é', '€', '注', '\u202e', '\u2066', '\u200b', '\ufeff', '\u2028', '\u2029', '\ufffd', '\U0001f600', '\U000e0001'}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.IntN(12); n > 0; n-- {
			switch rng.IntN(3) {
			case 0:
				b.WriteByte(byte(rng.IntN(256)))
			case 1:
				b.WriteRune(pool[rng.IntN(len(pool))])
			default:
				b.WriteRune(rune(rng.IntN(0x30000)))
			}
		}
		checkText(t, b.String())
	}
}

func FuzzText(f *testing.F) {
	for _, s := range []string{"", "orders.csv", "K-1\x1b[1A\x1b[2K", "bad\xff", `\x1b`, "\u202e", "a\\b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkText(t, s) })
}

func checkText(t *testing.T, s string) {
	t.Helper()
	out := Text(s)
	if !utf8.ValidString(out) {
		t.Fatalf("Text(%q) = %q: not UTF-8", s, out)
	}
	for _, r := range out {
		if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) {
			t.Fatalf("Text(%q) = %q holds %U", s, out, r)
		}
	}
	if back, err := unescape(out, false); err != nil || back != s {
		t.Fatalf("Text(%q) = %q reads back as %q (%v)", s, out, back, err)
	}
	if Printable(s) != (out == s) {
		t.Fatalf("Printable(%q) = %v, Text = %q", s, Printable(s), out)
	}
	q := Quote(s)
	inner := strings.TrimSuffix(strings.TrimPrefix(q, `"`), `"`)
	if len(inner) != len(q)-2 {
		t.Fatalf("Quote(%q) = %s: not in quotes", s, q)
	}
	if back, err := unescape(inner, true); err != nil || back != s {
		t.Fatalf("Quote(%q) = %s reads back as %q (%v)", s, q, back, err)
	}
}

// unescape reads a printable form back; in a quoted one, a double quote
// must be escaped.
func unescape(s string, quoted bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if quoted && s[i] == '"' {
			return "", strconv.ErrSyntax
		}
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		i++
		if i >= len(s) {
			return "", strconv.ErrSyntax
		}
		digits := 0
		switch s[i] {
		case '\\':
			b.WriteByte('\\')
		case '"':
			if !quoted {
				return "", strconv.ErrSyntax
			}
			b.WriteByte('"')
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'x':
			digits = 2
		case 'u':
			digits = 4
		case 'U':
			digits = 8
		default:
			return "", strconv.ErrSyntax
		}
		if digits == 0 {
			continue
		}
		if i+digits >= len(s) {
			return "", strconv.ErrSyntax
		}
		v, err := strconv.ParseUint(s[i+1:i+1+digits], 16, 32)
		if err != nil {
			return "", err
		}
		if s[i] == 'x' {
			b.WriteByte(byte(v))
		} else {
			b.WriteRune(rune(v))
		}
		i += digits
	}
	return b.String(), nil
}
