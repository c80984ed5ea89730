package partners_test

import (
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

// Across daylight-saving changes each wall time of the schedule is
// expected once: a time in the spring-forward gap at the first instant
// after it, a time repeated on the fall-back day at its first occurrence.
func TestExpectNextAcrossDaylightSavingChanges(t *testing.T) {
	for _, tc := range []struct {
		name, schedule, zone string
		from                 string // UTC
		want                 []string
	}{
		{"berlin spring forward", "30 2 * * *", "Europe/Berlin", "2027-03-26T12:00:00Z",
			[]string{"2027-03-27T02:30:00+01:00", "2027-03-28T03:00:00+02:00", "2027-03-29T02:30:00+02:00"}},
		{"berlin fall back", "30 2 * * *", "Europe/Berlin", "2027-10-29T12:00:00Z",
			[]string{"2027-10-30T02:30:00+02:00", "2027-10-31T02:30:00+02:00", "2027-11-01T02:30:00+01:00"}},
		{"new york spring forward", "30 2 * * *", "America/New_York", "2027-03-12T12:00:00Z",
			[]string{"2027-03-13T02:30:00-05:00", "2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"}},
		{"new york fall back", "30 1 * * *", "America/New_York", "2027-11-05T12:00:00Z",
			[]string{"2027-11-06T01:30:00-04:00", "2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"}},
		{"berlin hourly fall back", "30 * * * *", "Europe/Berlin", "2027-10-31T00:00:00Z",
			[]string{"2027-10-31T02:30:00+02:00", "2027-10-31T03:30:00+01:00"}},
		{"berlin hourly spring forward", "30 * * * *", "Europe/Berlin", "2027-03-28T00:00:00Z",
			[]string{"2027-03-28T01:30:00+01:00", "2027-03-28T03:00:00+02:00", "2027-03-28T03:30:00+02:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &partners.Expect{Schedule: tc.schedule, Timezone: tc.zone}
			if err := e.Validate("expect"); err != nil {
				t.Fatal(err)
			}
			at, err := time.Parse(time.RFC3339, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				at = e.Next(at)
				if got := at.Format(time.RFC3339); got != w {
					t.Fatalf("next %d: %s, want %s", i, got, w)
				}
			}
		})
	}
	// From inside the repeated hour (second occurrence) the repeated time is
	// not expected again.
	e := &partners.Expect{Schedule: "30 2 * * *", Timezone: "Europe/Berlin"}
	if err := e.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	if got := e.Next(time.Date(2027, 10, 31, 1, 15, 0, 0, time.UTC)).Format(time.RFC3339); got != "2027-11-01T02:30:00+01:00" { // 02:15 CET
		t.Fatalf("from the second 02:15: %s", got)
	}
}
