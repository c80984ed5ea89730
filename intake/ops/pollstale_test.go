package ops

import (
	"testing"
	"time"
)

// A partner's polls are stale when the poll its schedule had due after
// the last successful one is more than PollGrace overdue: a partner
// polled at the top of every hour is not stale forty minutes after its
// poll (a fixed quarter of an hour called it stale for most of every
// hour), one `@every 30s` is after a quarter of an hour without a
// successful poll; never polled is stale.
func TestPollStaleFollowsThePartnersSchedule(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	last := at("2026-12-06T10:00:05Z")
	for _, c := range []struct {
		spec  string
		now   string
		stale bool
	}{
		{"@every 30s", "2026-12-06T10:10:00Z", false},
		{"@every 30s", "2026-12-06T10:16:00Z", true},
		{"0 * * * *", "2026-12-06T10:40:00Z", false},
		{"0 * * * *", "2026-12-06T11:14:00Z", false},
		{"0 * * * *", "2026-12-06T11:16:00Z", true},
		{"not a schedule", "2026-12-06T10:14:00Z", false},
		{"not a schedule", "2026-12-06T10:16:00Z", true},
	} {
		if got := PollStale(c.spec, &last, at(c.now)); got != c.stale {
			t.Errorf("%q, last OK %s, at %s: stale %v, want %v", c.spec, last.Format(time.TimeOnly), c.now, got, c.stale)
		}
	}
	if !PollStale("@every 30s", nil, at("2026-12-06T10:00:00Z")) {
		t.Error("a partner never polled is not stale")
	}
}
