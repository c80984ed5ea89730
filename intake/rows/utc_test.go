package rows

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

// FuzzUTCSeconds: whatever UTCSeconds reads, time.Parse reads as the same
// instant; what it does not read is left to time.Parse.
func FuzzUTCSeconds(f *testing.F) {
	for _, seed := range []string{"2026-01-02T03:04:05Z", "2024-02-29T23:59:59.999999999Z", "2023-02-29T00:00:00Z",
		"0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-01-02T03:04:60Z", "2026-13-01T00:00:00Z",
		"2026-01-02T03:04:05.Z", "2026-01-02T03:04:05.1234567890Z", "2026-01-02T03:04:05+01:00", "2026-01-02 03:04:05Z",
		"+026-01-02T03:04:05Z", "2026-01-02T03:04:05,5Z", "2026-01-02T24:00:00Z", "1900-02-29T00:00:00Z", "2000-02-29T00:00:00Z"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sec, nsec, ok := UTCSeconds(s)
		if !ok {
			return
		}
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("%q: UTCSeconds read it, time.Parse refuses it: %v", s, err)
		}
		if tm.Unix() != sec || tm.Nanosecond() != nsec {
			t.Fatalf("%q: UTCSeconds %d.%09d, time.Parse %d.%09d", s, sec, nsec, tm.Unix(), tm.Nanosecond())
		}
	})
}

// Every instant from year 1 to 9999, written as the timestamp check
// writes it, is read by UTCSeconds as time.Parse reads it, and the check
// gives back what it gave before it had that path: time.Parse's instant,
// rounded to the microsecond, formatted.
func TestUTCSecondsReadsEveryInstantTheCheckWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lo, hi := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()
	check := newCheck(partners.Column{Name: "at", Type: partners.TypeTimestamp, Layout: time.RFC3339})
	for i := range 200_000 {
		var ns int
		switch i % 4 {
		case 1:
			ns = rng.IntN(1_000_000) * 1000
		case 2:
			ns = rng.IntN(1_000_000_000)
		case 3:
			ns = rng.IntN(10) * 100_000_000
		}
		tm := time.Unix(lo+rng.Int64N(hi-lo+1), int64(ns)).UTC()
		s := tm.Format(time.RFC3339Nano)
		sec, nsec, ok := UTCSeconds(s)
		if !ok || sec != tm.Unix() || nsec != tm.Nanosecond() {
			t.Fatalf("%q: UTCSeconds %d.%09d %v, want %d.%09d", s, sec, nsec, ok, tm.Unix(), tm.Nanosecond())
		}
		for _, cell := range []string{s, strings.Replace(s, "Z", "+00:00", 1), " " + s} {
			got, _, why := check(cell)
			want := Microseconds(tm).Format(time.RFC3339Nano)
			if why != "" || got != want {
				t.Fatalf("check(%q) = %q %q, want %q", cell, got, why, want)
			}
		}
	}
}

// A string that looks like the check's form but is not a valid instant is
// not read by UTCSeconds, and the check refuses it as before.
func TestUTCSecondsLeavesInvalidTimesToTimeParse(t *testing.T) {
	check := newCheck(partners.Column{Name: "at", Type: partners.TypeTimestamp, Layout: time.RFC3339})
	for _, s := range []string{"2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-01-02T24:00:00Z",
		"2026-01-02T03:60:00Z", "2026-01-02T03:04:60Z", "2026-00-02T03:04:05Z", "2026-01-00T03:04:05Z", "0000-06-01T00:00:00Z"} {
		if _, _, ok := UTCSeconds(s); ok {
			t.Errorf("UTCSeconds read %q", s)
		}
		if _, _, why := check(s); why == "" {
			t.Errorf("check accepted %q", s)
		}
	}
	if _, _, ok := UTCSeconds("2024-02-29T00:00:00Z"); !ok {
		t.Error("UTCSeconds refused a leap day")
	}
}
