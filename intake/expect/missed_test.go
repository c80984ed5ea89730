package expect_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A daily feed misses one window; the next day's file comes on time: it
// delivers its own window, the missed one stays late.
func TestOneMissedWindowDoesNotMakeLaterOnTimeFilesLate(t *testing.T) {
	_, pool := testenv.DB(t)
	r, at := dailyReplica(t, pool)
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

// A late window left open (its file never came, nobody acknowledged it)
// does not make the evaluator read every file since: with more files
// after it than one evaluation reads (5,000), and more than that within
// one later window, each later window is still decided. The evaluator
// reads, per window, whether a file delivered it and the first file that
// closes a late one: never a list of files.
func TestAnOldOpenLateWindowAndABusyFeedDoNotStallTheEvaluation(t *testing.T) {
	_, pool := testenv.DB(t)
	r, at := dailyReplica(t, pool)
	r.run(t, at(0, 5, 0))
	r.run(t, at(0, 8, 0).Add(2*time.Second)) // day 0: no file, late
	// day 1: 6,000 files between 06:30 and 07:30, on time
	if _, err := pool.Exec(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		state, worker_id, lease_until, claimed_at)
		SELECT 'acme', 'orders', 'o' || i || '.csv', 'processing/w/o' || i || '.csv', 1, 'archived', 'w', now(),
		       $1::timestamptz + i * interval '600 milliseconds'
		FROM generate_series(1, 6000) i`, at(1, 6, 30)); err != nil {
		t.Fatal(err)
	}
	// day 2: no file
	r.run(t, at(2, 8, 0).Add(2*time.Second))
	got := lateRows(t, pool)
	if len(got) != 2 || !got[0].Scheduled.Equal(at(0, 6, 0)) || got[0].ClosedBy != 0 || !got[1].Scheduled.Equal(at(2, 6, 0)) {
		t.Fatalf("want day 0 late and still open, day 1 delivered, day 2 late: %+v", got)
	}
	var lastDeadline time.Time
	if err := pool.QueryRow(context.Background(), `SELECT last_deadline FROM intake_feed_expect WHERE partner_id = 'acme'`).Scan(&lastDeadline); err != nil {
		t.Fatal(err)
	}
	if !lastDeadline.Equal(at(2, 8, 0)) {
		t.Fatalf("evaluated up to %s, want day 2's deadline", lastDeadline)
	}
}

// dailyReplica is an evaluator of replica "a" for partner acme's feed
// orders, expected daily at 06:00 UTC with 2 h grace, and the time of day
// hh:mm of day n of the tests' week (day 0 is 2026-11-02).
func dailyReplica(t *testing.T, pool *pgxpool.Pool) (replica, func(day, hh, mm int) time.Time) {
	t.Helper()
	parts := []partners.Config{{ID: "acme", Feeds: []partners.Feed{{Name: "orders",
		Expect: &partners.Expect{Schedule: "0 6 * * *", Timezone: "UTC", Grace: 2 * time.Hour}}}}}
	if err := parts[0].Feeds[0].Expect.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	at := func(day, hh, mm int) time.Time { return time.Date(2026, 11, 2+day, hh, mm, 0, 0, time.UTC) }
	return newReplica(t, pool, "a", parts), at
}
