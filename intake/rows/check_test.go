package rows

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/partners"
)

// canonicalDecimal is the plain rule checkDecimal must agree with: drop a
// '+', leading zeros of the integer part, trailing zeros of the fraction,
// and the sign of zero.
func canonicalDecimal(s string) string {
	neg := strings.HasPrefix(s, "-")
	body := strings.TrimLeft(s, "+-")
	i, f, _ := strings.Cut(body, ".")
	i = strings.TrimLeft(i, "0")
	if i == "" {
		i = "0"
	}
	f = strings.TrimRight(f, "0")
	out := i
	if f != "" {
		out += "." + f
	}
	if neg && out != "0" {
		out = "-" + out
	}
	return out
}

func TestDecimalsAreCanonicalWhetherOrNotTheyCameThatWay(t *testing.T) {
	var in []string
	for _, sign := range []string{"", "-", "+"} {
		for _, i := range []string{"0", "00", "5", "05", "10", "100", "007"} {
			in = append(in, sign+i)
			for _, f := range []string{"0", "00", "5", "50", "05", "1"} {
				in = append(in, sign+i+"."+f)
			}
		}
	}
	for _, s := range in {
		got, why := checkDecimal(s, 2)
		if why != "" {
			t.Fatalf("%q refused: %s", s, why)
		}
		if want := canonicalDecimal(s); got != want {
			t.Errorf("checkDecimal(%q) = %q, want %q", s, got, want)
		}
	}
}

func TestTimestampsAreCanonicalUTC(t *testing.T) {
	c := newCheck(partners.Column{Name: "ts", Type: partners.TypeTimestamp, Layout: time.RFC3339})
	for in, want := range map[string]string{
		"2026-01-02T03:04:05Z":      "2026-01-02T03:04:05Z",
		" 2026-01-02T03:04:05Z ":    "2026-01-02T03:04:05Z",
		"2026-01-02T03:04:05+01:00": "2026-01-02T02:04:05Z",
		"2026-01-02T03:04:05.50Z":   "2026-01-02T03:04:05.5Z",
	} {
		got, null, why := c(in)
		if why != "" || null || got != want {
			t.Errorf("%q: got %q (null %v, why %q), want %q", in, got, null, why, want)
		}
	}
	for _, bad := range []string{"2026-01-02T24:04:05Z", "2026-01-02T03:04:60Z", "2026-01-02t03:04:05Z", "2026-13-02T03:04:05Z"} {
		if _, _, why := c(bad); why != reason.BadTimestamp {
			t.Errorf("%q: why %q, want %s", bad, why, reason.BadTimestamp)
		}
	}
}

// Year 0 (parsed here, none in PostgreSQL: the text COPY refused it, the
// binary one stored 1 BC) is refused, in UTC; a timestamp finer than
// PostgreSQL's microseconds is rounded as PostgreSQL rounds it, so two
// keys PostgreSQL holds as one are one in the chunk's dedupe too (they
// were two, and the set-based merge failed the whole file).
func TestValuesAreReadAsPostgreSQLReadsThem(t *testing.T) {
	ts := newCheck(partners.Column{Name: "ts", Type: partners.TypeTimestamp, Layout: time.RFC3339})
	for in, want := range map[string]string{
		"0000-03-01T00:00:00Z":      string(reason.BadTimestamp),
		"0001-01-01T00:30:00+01:00": string(reason.BadTimestamp), // year 0 in UTC
		"0000-12-31T23:30:00-01:00": "0001-01-01T00:30:00Z",
		"0001-01-01T00:00:00Z":      "0001-01-01T00:00:00Z",
		// finer than a microsecond: rounded as PostgreSQL rounds (half to
		// even), so the dedupe sees what the table will hold
		"2026-01-01T00:00:00.0000001Z":   "2026-01-01T00:00:00Z",
		"2026-01-01T00:00:00.123456789Z": "2026-01-01T00:00:00.123457Z",
		"2026-01-01T00:00:00.0000005Z":   "2026-01-01T00:00:00Z",
		"2026-01-01T00:00:00.0000015Z":   "2026-01-01T00:00:00.000002Z",
		"2026-01-01T00:00:00.9999996Z":   "2026-01-01T00:00:01Z",
		"2026-01-01T00:00:00.123456Z":    "2026-01-01T00:00:00.123456Z",
	} {
		got, _, why := ts(in)
		if want == string(reason.BadTimestamp) {
			if why != reason.Code(want) {
				t.Errorf("timestamp %q: why %q, want %q", in, why, want)
			}
			continue
		}
		if why != "" || got != want {
			t.Errorf("timestamp %q: %q (why %q), want %q", in, got, why, want)
		}
	}
	d := newCheck(partners.Column{Name: "d", Type: partners.TypeDate, Layout: "2006-01-02"})
	for in, want := range map[string]reason.Code{"0000-03-01": reason.BadDate, "0001-01-01": "", "9999-12-31": ""} {
		if _, _, why := d(in); why != want {
			t.Errorf("date %q: why %q, want %q", in, why, want)
		}
	}
}

// An integer cell's value is FormatInt's of what ParseInt reads, whether
// it is taken as written or written again.
func FuzzIntegerValueIsCanonical(f *testing.F) {
	for _, s := range []string{"0", "-0", "+0", "+5", "007", "-007", " 42 ", "-1", "10", "9223372036854775807",
		"-9223372036854775808", "1e3", "0x1f", "1_000", "", "-", "+"} {
		f.Add(s)
	}
	check := newCheck(partners.Column{Name: "n", Type: partners.TypeInteger})
	f.Fuzz(func(t *testing.T, s string) {
		v, null, why := check(s)
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		switch {
		case null:
		case err != nil:
			if why != reason.NotInteger {
				t.Fatalf("%q: %q %v, want not_integer", s, v, why)
			}
		case why == "" && v != strconv.FormatInt(n, 10):
			t.Fatalf("%q: %q, want %q", s, v, strconv.FormatInt(n, 10))
		}
	})
}
