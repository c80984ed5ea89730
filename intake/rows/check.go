package rows

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/partners"
)

// check validates one cell and returns its normalised value (null for an
// empty optional cell) or a reason code.
type check func(cell string) (v string, null bool, why reason.Code)

func newCheck(c partners.Column) check {
	var typed func(string) (string, reason.Code)
	switch c.Type {
	case partners.TypeText:
		max := c.MaxLength
		typed = func(s string) (string, reason.Code) {
			if utf8.RuneCountInString(s) > max {
				return "", reason.TooLong
			}
			return s, ""
		}
	case partners.TypeInteger:
		digits := c.IntegerDigits()
		typed = func(s string) (string, reason.Code) {
			s = strings.TrimSpace(s)
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return "", reason.NotInteger
			}
			v := s // what FormatInt writes, unless a sign or zeros lead
			if !canonicalInt(s) {
				v = strconv.FormatInt(n, 10)
			}
			if len(strings.TrimPrefix(v, "-")) > digits {
				return "", reason.PrecisionExceeded
			}
			return v, ""
		}
	case partners.TypeDecimal:
		scale, digits := c.Scale, c.IntegerDigits()
		typed = func(s string) (string, reason.Code) {
			v, why := checkDecimal(strings.TrimSpace(s), scale)
			if why == "" && integerDigits(v) > digits {
				return "", reason.PrecisionExceeded
			}
			return v, why
		}
	case partners.TypeDate:
		layout := c.Layout
		typed = func(s string) (string, reason.Code) {
			t, err := time.Parse(layout, strings.TrimSpace(s))
			if err != nil || t.Year() < 1 {
				// year 0 parses, and PostgreSQL has none: the text COPY
				// refused it, the binary one stored 1 BC
				return "", reason.BadDate
			}
			return t.Format("2006-01-02"), ""
		}
	case partners.TypeTimestamp:
		layout := c.Layout
		typed = func(s string) (string, reason.Code) {
			s = strings.TrimSpace(s)
			if layout == time.RFC3339 && canonicalUTC(s) {
				return s, "" // what Format would write of what time.Parse reads
			}
			t, err := time.Parse(layout, s)
			if err != nil || t.UTC().Year() < 1 {
				// year 0 parses (or a zone moves 0001-01-01 into it), and
				// PostgreSQL has none: the text COPY refused it, the
				// binary one stored 1 BC
				return "", reason.BadTimestamp
			}
			if t.Nanosecond()%1000 != 0 {
				// PostgreSQL keeps microseconds and rounds the rest (half
				// to even): rounded here alike, so two values one
				// PostgreSQL holds as one are one in the chunk's dedupe
				// too (.NET's round-trip format writes 100 ns)
				t = Microseconds(t)
				return t.UTC().Format(time.RFC3339Nano), ""
			}
			return t.UTC().Format(time.RFC3339Nano), ""
		}
	case partners.TypeEnum:
		allowed := make(map[string]bool, len(c.Values))
		for _, v := range c.Values {
			allowed[v] = true
		}
		typed = func(s string) (string, reason.Code) {
			s = strings.TrimSpace(s)
			if !allowed[s] {
				return "", reason.NotInEnum
			}
			return s, ""
		}
	case partners.TypeEmail:
		typed = func(s string) (string, reason.Code) {
			s = strings.TrimSpace(s)
			if !validEmail(s) {
				return "", reason.BadEmail
			}
			return s, ""
		}
	default:
		panic("rows: unvalidated column type " + c.Type)
	}
	required := c.Required
	return func(cell string) (string, bool, reason.Code) {
		if cell == "" || strings.TrimSpace(cell) == "" {
			if required {
				return "", true, reason.RequiredMissing
			}
			return "", true, ""
		}
		v, why := typed(cell)
		return v, false, why
	}
}

// canonicalInt: s, which ParseInt read, is as FormatInt writes its
// value: no plus sign, no leading zero but in "0" itself, no "-0".
func canonicalInt(s string) bool {
	d := strings.TrimPrefix(s, "-")
	return s[0] != '+' && (d[0] != '0' || s == "0")
}

// checkDecimal accepts [+-]digits[.digits] with at most scale fraction
// digits and returns its canonical form (PostgreSQL parses it exactly).
func checkDecimal(s string, scale int) (string, reason.Code) {
	body := s
	if body != "" && (body[0] == '+' || body[0] == '-') {
		body = body[1:]
	}
	intPart, frac, hasDot := strings.Cut(body, ".")
	if intPart == "" || !allDigits(intPart) || (hasDot && (frac == "" || !allDigits(frac))) || len(intPart) > 100 {
		return "", reason.NotDecimal
	}
	if len(frac) > scale {
		return "", reason.ScaleExceeded
	}
	// canonical form, so equal values compare equal as text (duplicate
	// keys are found before the database sees them)
	intPart = strings.TrimLeft(intPart, "0")
	if intPart == "" {
		intPart = "0"
	}
	frac = strings.TrimRight(frac, "0")
	if s[0] != '+' && (s[0] != '-' || intPart != "0" || frac != "") && len(s) == len(intPart)+btoi(frac != "")*(1+len(frac))+btoi(s[0] == '-') {
		return s, "" // already canonical: no sign to drop, no leading or trailing zeros
	}
	out := intPart
	if frac != "" {
		out += "." + frac
	}
	if s[0] == '-' && out != "0" {
		out = "-" + out
	}
	return out, ""
}

// integerDigits counts the digits before the point of a canonical decimal
// (a lone 0 before the point counts none, as in numeric(p,s)).
func integerDigits(v string) int {
	v = strings.TrimPrefix(v, "-")
	i, _, _ := strings.Cut(v, ".")
	if i == "0" {
		return 0
	}
	return len(i)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validEmail is a deliberately plain check: one '@', a non-empty local part,
// a dotted domain, no spaces or control characters, at most 254 bytes.
func validEmail(s string) bool {
	if len(s) > 254 {
		return false
	}
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || len(local) > 64 || strings.Contains(domain, "@") {
		return false
	}
	if !strings.Contains(domain, ".") || strings.HasPrefix(domain, ".") || strings.HasSuffix(domain, ".") || strings.Contains(domain, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		// bytes >= 0x80 belong to multi-byte runes (the cell is valid
		// UTF-8), none of which is refused here
		if b := s[i]; b <= ' ' || b == 0x7f || b == '"' || b == ',' || b == '<' || b == '>' || b == '(' || b == ')' || b == ';' || b == '\\' {
			return false
		}
	}
	return true
}

// canonicalUTC: s is a timestamp in UTC as the check writes it, whole
// microseconds or less with no trailing zero in the fraction
// (YYYY-MM-DDTHH:MM:SSZ, YYYY-MM-DDTHH:MM:SS.25Z), a valid time.
func canonicalUTC(s string) bool {
	const whole = len("2006-01-02T15:04:05Z")
	if len(s) != whole && (len(s) < whole+2 || len(s) > whole+7 || s[len(s)-2] == '0') {
		return false
	}
	_, _, ok := UTCSeconds(s)
	return ok
}

// Microseconds rounds t to a microsecond as PostgreSQL reads a timestamp
// (rint: half to even).
func Microseconds(t time.Time) time.Time {
	base := t.Truncate(time.Microsecond)
	r := t.Nanosecond() % 1000
	if r > 500 || (r == 500 && (base.Nanosecond()/1000)%2 == 1) {
		base = base.Add(time.Microsecond)
	}
	return base
}
