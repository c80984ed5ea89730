package expect_test

import (
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// The evaluator runs on the daemon's grants (intake grants): as the
// daemon's role it starts watching a feed, raises a late window once
// its deadline passes without a file, and a late file closes it.
func TestTheEvaluatorRunsOnTheDaemonsGrants(t *testing.T) {
	url, admin := testenv.DB(t)
	pool := testenv.GrantRoles(t, url, admin, "").DaemonPool(t)
	parts := []partners.Config{{ID: "acme", Feeds: []partners.Feed{{Name: "orders",
		Expect: &partners.Expect{Schedule: "0 6 * * *", Timezone: "UTC", Grace: 2 * time.Hour}}}}}
	if err := parts[0].Feeds[0].Expect.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	at := func(hh int) time.Time { return time.Date(2026, 12, 1, hh, 0, 0, 0, time.UTC) }
	r := newReplica(t, pool, "a", parts)
	r.run(t, at(5))
	r.run(t, at(8).Add(time.Second))
	if got := lateRows(t, admin); len(got) != 1 || !got[0].Scheduled.Equal(at(6)) || got[0].ClosedBy != 0 {
		t.Fatalf("late rows %+v, want 06:00 late", got)
	}
	id := addFile(t, admin, "archived", at(9))
	r.run(t, at(10))
	if got := lateRows(t, admin); len(got) != 1 || got[0].ClosedBy != id {
		t.Fatalf("late rows %+v, want 06:00 closed by intake %d", got, id)
	}
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_outbox WHERE event = 'late'`); n != 1 {
		t.Errorf("%d late events, want 1", n)
	}
}
