// Package inert renders text a partner controls (file names, key and cell
// values, details, messages of a site) in a form that is safe to print on
// an ops terminal and to store as PostgreSQL text: valid UTF-8 with no
// control or format characters. Printable text passes unchanged; every
// other character is written as a Go-style escape (\x1b, \u202e, \xff for
// a byte that is not UTF-8) and a backslash as \\, so the form is
// unambiguous: two different texts never share one.
package inert

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// Text is s's printable form. Escaped are: control characters (C0, DEL
// and C1, ESC among them), Unicode format characters (category Cf: the
// bidirectional overrides and isolates U+202A–U+202E and U+2066–U+2069,
// zero-width characters, the byte order mark), the line and paragraph
// separators U+2028 and U+2029 (categories Zl, Zp), each byte that is
// not part of valid UTF-8, and the backslash. U+FFFD written as such is
// printable, and passes.
func Text(s string) string {
	return escape(s, 0)
}

// Quote is s's printable form in double quotes, its double quotes
// escaped too: a value whose bounds must show (a cell that may be empty
// or hold spaces, " -> " or "; ").
func Quote(s string) string {
	return `"` + escape(s, '"') + `"`
}

// Lines is the printable form of each line of s, joined by newlines
// again: an error joined of several (errors.Join) stays one per line.
func Lines(s string) string {
	if Printable(s) {
		return s
	}
	ls := strings.Split(s, "\n")
	for i, l := range ls {
		ls[i] = Text(l)
	}
	return strings.Join(ls, "\n")
}

// Printable reports whether Text(s) == s.
func Printable(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '\\' {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, n) {
			return false
		}
		i += n
	}
	return true
}

// needsEscape reports whether the rune r, n bytes long in the text, is
// escaped (r == RuneError with n == 1 is a byte that is not UTF-8).
func needsEscape(r rune, n int) bool {
	switch {
	case r == '\\':
		return true
	case r < 0x20 || r == 0x7f:
		return true
	case r < 0x7f:
		return false
	case r == utf8.RuneError && n == 1:
		return true // a byte that is not UTF-8
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

func escape(s string, quote byte) string {
	if quote == 0 && Printable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case quote != 0 && r == rune(quote):
			b.WriteByte('\\')
			b.WriteByte(quote)
		case !needsEscape(r, n):
			b.WriteString(s[i : i+n])
		case r == utf8.RuneError && n == 1:
			writeHex(&b, 'x', uint32(s[i]), 2)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			writeHex(&b, 'x', uint32(r), 2)
		case r <= 0xffff:
			writeHex(&b, 'u', uint32(r), 4)
		default:
			writeHex(&b, 'U', uint32(r), 8)
		}
		i += n
	}
	return b.String()
}

func writeHex(b *strings.Builder, kind byte, v uint32, digits int) {
	b.WriteByte('\\')
	b.WriteByte(kind)
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		b.WriteByte(hex[v>>uint(shift)&0xf])
	}
}
