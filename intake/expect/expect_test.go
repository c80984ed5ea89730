package expect_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type replica struct {
	svc *expect.Service
	reg *prometheus.Registry
}

func newReplica(t *testing.T, pool *pgxpool.Pool, worker string, parts []partners.Config) replica {
	reg := prometheus.NewRegistry()
	return replica{expect.New(pool, worker, time.Hour, parts, reg, testenv.Logger(t)), reg}
}

func (r replica) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.Gauge != nil {
				sum += m.Gauge.GetValue()
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}

func (r replica) run(t *testing.T, now time.Time) {
	t.Helper()
	if err := r.svc.RunOnce(context.Background(), now); err != nil {
		t.Fatal(err)
	}
}

// addFile records a file of the feed as the pipeline does, claimed at claimed.
func addFile(t *testing.T, pool *pgxpool.Pool, state string, claimed time.Time) int64 {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		state, worker_id, lease_until, claimed_at) VALUES ('acme', 'orders', 'orders.csv', 'processing/w/orders.csv', 1, $1, 'w', now(), $2)
		RETURNING intake_id`, state, claimed).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

type late struct {
	Scheduled time.Time
	ClosedBy  int64
	RaisedBy  string
}

func lateRows(t *testing.T, pool *pgxpool.Pool) []late {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT scheduled_at, coalesce(closed_intake_id, 0), raised_by FROM intake_feed_late
		WHERE partner_id = 'acme' AND feed = 'orders' ORDER BY scheduled_at`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []late
	for rs.Next() {
		var l late
		if err := rs.Scan(&l.Scheduled, &l.ClosedBy, &l.RaisedBy); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// A week of a weekday feed due at 06:00 Berlin with 2h grace, driven by
// explicit clocks (the evaluator takes `now`), on a real PostgreSQL with
// two replicas and a restart: each window is decided once, a calendar day
// raises nothing, a late file closes the oldest late window and counts for
// no other, a file still in flight defers the decision.
func TestWindowsAreDecidedOnceAcrossReplicasAndRestarts(t *testing.T) {
	_, pool := testenv.DB(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	cal := filepath.Join(t.TempDir(), "holidays.txt")
	if err := os.WriteFile(cal, []byte("# days without delivery\n2026-12-01  # Tuesday\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parts := []partners.Config{{ID: "acme", Feeds: []partners.Feed{{Name: "orders",
		Expect: &partners.Expect{Schedule: "0 6 * * MON-FRI", Timezone: "Europe/Berlin", Grace: 2 * time.Hour, Calendar: cal}}}}}
	if err := parts[0].Feeds[0].Expect.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	at := func(day, hh, mm int) time.Time { return time.Date(2026, 11, 30+day, hh, mm, 0, 0, berlin) } // day 0: Monday 30 Nov
	a, b := newReplica(t, pool, "a", parts), newReplica(t, pool, "b", parts)

	a.run(t, at(0, 5, 0)) // intake starts watching the feed before Monday's window
	if got := lateRows(t, pool); len(got) != 0 {
		t.Fatalf("late rows before any deadline: %+v", got)
	}
	// Monday: no file by 08:00; both replicas judge at once.
	var wg sync.WaitGroup
	for _, r := range []replica{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); r.run(t, at(0, 8, 0).Add(2*time.Second)) }()
	}
	wg.Wait()
	got := lateRows(t, pool)
	if len(got) != 1 || !got[0].Scheduled.Equal(at(0, 6, 0)) || got[0].ClosedBy != 0 {
		t.Fatalf("want Monday 06:00 late, once: %+v", got)
	}
	if n := a.metric(t, "intake_feed_late_windows_total") + b.metric(t, "intake_feed_late_windows_total"); n != 1 {
		t.Fatalf("the window was counted %v times across the replicas, want 1", n)
	}
	a.run(t, at(0, 8, 5))
	b.run(t, at(0, 8, 5))
	if a.metric(t, "intake_feed_late") != 1 || b.metric(t, "intake_feed_late") != 1 {
		t.Fatalf("intake_feed_late: a %v, b %v; want 1 on both", a.metric(t, "intake_feed_late"), b.metric(t, "intake_feed_late"))
	}
	// a restarts: it forgets nothing and raises nothing again.
	a = newReplica(t, pool, "a", parts)
	a.run(t, at(0, 9, 0))
	if got := lateRows(t, pool); len(got) != 1 || a.metric(t, "intake_feed_late") != 1 || a.metric(t, "intake_feed_late_windows_total") != 0 {
		t.Fatalf("after a restart: rows %+v, gauge %v, raised %v", got, a.metric(t, "intake_feed_late"), a.metric(t, "intake_feed_late_windows_total"))
	}

	// Tuesday is a calendar day: nothing is raised, though no file came.
	b.run(t, at(1, 9, 0))
	if got := lateRows(t, pool); len(got) != 1 {
		t.Fatalf("a calendar day raised a window: %+v", got)
	}
	// Tuesday 10:00 Monday's file arrives: it closes Monday's window late…
	monday := addFile(t, pool, "archived", at(1, 10, 0))
	b.run(t, at(1, 10, 1))
	if got := lateRows(t, pool); len(got) != 1 || got[0].ClosedBy != monday {
		t.Fatalf("want Monday closed by intake %d: %+v", monday, got)
	}
	if b.metric(t, "intake_feed_late") != 0 || b.metric(t, "intake_feed_late_arrivals_total") != 1 {
		t.Fatalf("after the late file: gauge %v, arrivals %v", b.metric(t, "intake_feed_late"), b.metric(t, "intake_feed_late_arrivals_total"))
	}
	// …and does not count for Wednesday, which is late without a file of its own.
	a.run(t, at(2, 8, 0).Add(2*time.Second))
	got = lateRows(t, pool)
	if len(got) != 2 || !got[1].Scheduled.Equal(at(2, 6, 0)) || got[1].ClosedBy != 0 {
		t.Fatalf("want Wednesday late: %+v", got)
	}
	// Wednesday's file and Thursday's come on Thursday morning: the first
	// closes Wednesday's window, the second delivers Thursday's on time.
	wed := addFile(t, pool, "archived", at(3, 5, 0))
	addFile(t, pool, "archived", at(3, 7, 0))
	// Friday's file is still being applied when its deadline passes: no decision yet.
	fri := addFile(t, pool, "applying", at(4, 7, 59))
	a.run(t, at(4, 8, 30))
	got = lateRows(t, pool)
	if len(got) != 2 || got[1].ClosedBy != wed {
		t.Fatalf("want Wednesday closed by %d and Thursday on time: %+v", wed, got)
	}
	var lastScheduled time.Time
	if err := pool.QueryRow(context.Background(), `SELECT last_scheduled FROM intake_feed_expect WHERE partner_id = 'acme'`).Scan(&lastScheduled); err != nil {
		t.Fatal(err)
	}
	if !lastScheduled.Equal(at(3, 6, 0)) {
		t.Fatalf("decided up to %v, want Thursday 06:00 (Friday waits for its file in flight)", lastScheduled.In(berlin))
	}
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET state = 'archived' WHERE intake_id = $1`, fri); err != nil {
		t.Fatal(err)
	}
	b.run(t, at(4, 8, 31))
	if got := lateRows(t, pool); len(got) != 2 || a.metric(t, "intake_feed_late") != 0 {
		t.Fatalf("Friday's file was accepted before its deadline: %+v", got)
	}
	// each late window wrote its one notification, in its transaction
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox WHERE event = 'late' AND partner_id = 'acme'
		AND payload->>'feed' = 'orders' AND (payload->>'scheduled_at')::timestamptz IN (SELECT scheduled_at FROM intake_feed_late)`); n != 2 ||
		testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox`) != 2 {
		t.Fatalf("%d late events for the 2 late windows", n)
	}
	if testutil.CollectAndCount(a.reg, "intake_expect_errors_total") != 1 || a.metric(t, "intake_expect_errors_total") != 0 {
		t.Fatal("evaluations failed")
	}
}

// The next windows in the feed's time zone, calendar days marked, across a
// change to daylight saving time.
func TestUpcomingWindows(t *testing.T) {
	cal := filepath.Join(t.TempDir(), "cal")
	if err := os.WriteFile(cal, []byte("2027-03-29\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &partners.Expect{Schedule: "0 6 * * MON-FRI", Timezone: "Europe/Berlin", Grace: 2 * time.Hour, Calendar: cal}
	if err := e.Validate("expect"); err != nil {
		t.Fatal(err)
	}
	ws := expect.Upcoming(e, time.Date(2027, 3, 26, 12, 0, 0, 0, time.UTC), 3) // Friday before the change
	want := []struct {
		utc  string
		skip bool
	}{{"2027-03-29T04:00:00Z", true}, {"2027-03-30T04:00:00Z", false}, {"2027-03-31T04:00:00Z", false}}
	for i, w := range want {
		if got := ws[i].Scheduled.UTC().Format(time.RFC3339); got != w.utc || ws[i].NoDelivery != w.skip || !ws[i].Deadline.Equal(ws[i].Scheduled.Add(2*time.Hour)) {
			t.Fatalf("window %d: %v (no delivery %v), want %s (%v)", i, got, ws[i].NoDelivery, w.utc, w.skip)
		}
	}
	for _, bad := range []partners.Expect{
		{Schedule: "0 6 * *", Timezone: "UTC"},
		{Schedule: "0 6 * * *", Timezone: "Mars/Olympus"},
		{Schedule: "0 6 * * *", Grace: -time.Second},
		{Schedule: "CRON_TZ=UTC 0 6 * * *"},
		{Schedule: "0 6 * * *", Calendar: filepath.Join(t.TempDir(), "missing")},
	} {
		if err := bad.Validate("expect"); err == nil {
			t.Fatalf("%+v validated", bad)
		}
	}
	badCal := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(badCal, []byte("2027-03-29\n29.03.2027\n"), 0o600)
	if err := (&partners.Expect{Schedule: "@daily", Calendar: badCal}).Validate("expect"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a calendar line that is not a date: %v", err)
	}
}
