package expect_test

import (
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A daily feed misses one window; the next day's file comes on time: it
// delivers its own window, the missed one stays late.
func TestOneMissedWindowDoesNotMakeLaterOnTimeFilesLate(t *testing.T) {
	_, pool := testenv.DB(t)
	parts := []partners.Config{{ID: "acme", Feeds: []partners.Feed{{Name: "orders",
		Expect: &partners.Expect{Schedule: "0 6 * * *", Timezone: "UTC", Grace: 2 * time.Hour}}}}}
	if err := parts[0].Feeds[0].Expect.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	at := func(day, hh, mm int) time.Time { return time.Date(2026, 11, 2+day, hh, mm, 0, 0, time.UTC) }
	r := newReplica(t, pool, "a", parts)
	r.run(t, at(0, 5, 0))
	r.run(t, at(0, 8, 0).Add(2*time.Second)) // day 0: no file
	if got := lateRows(t, pool); len(got) != 1 || !got[0].Scheduled.Equal(at(0, 6, 0)) {
		t.Fatalf("want day 0 late: %+v", got)
	}
	addFile(t, pool, "archived", at(1, 7, 0)) // day 1's file, on time
	r.run(t, at(1, 8, 0).Add(2*time.Second))
	got := lateRows(t, pool)
	if len(got) != 1 || !got[0].Scheduled.Equal(at(0, 6, 0)) || got[0].ClosedBy != 0 {
		t.Fatalf("want only day 0 late, still open; day 1 delivered on time: %+v", got)
	}
	if g := r.metric(t, "intake_feed_late"); g != 1 {
		t.Fatalf("intake_feed_late %v, want 1 (day 0 still missed)", g)
	}
}
