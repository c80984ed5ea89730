package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// freeAddr is a loopback address nothing listens on (for /metrics).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape sums the samples of metric name on a daemon's /metrics; ok is
// false while it does not answer.
func scrape(addr, name string) (sum float64, ok bool) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, resp.StatusCode == http.StatusOK
}

// expectConfig is the CLI tests' config with an expect: block on the feed
// (a six-field schedule that fires once a day at due, UTC, grace 1s), a
// second feed "stock" on the same schedule whose calendar lists due's
// day and the next, the evaluator checking every 200ms, and /metrics on listen.
func expectConfig(t *testing.T, site *testenv.Site, worker, spoolDir, listen string, due time.Time) string {
	t.Helper()
	p := writeConfigOpts(t, site, cfgOpts{worker: worker, poll: "@every 1s", schedule: "@every 1h", spool: spoolDir})
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(raw), "listen: 127.0.0.1:0", "listen: "+listen, 1)
	s = "expect_check: 200ms\n" + s
	due = due.UTC()
	cal := filepath.Join(t.TempDir(), "holidays.txt")
	if err := os.WriteFile(cal, []byte("# no stock on the test's day and the next\n"+due.Format(time.DateOnly)+"\n"+due.AddDate(0, 0, 1).Format(time.DateOnly)+"  # tomorrow\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sched := fmt.Sprintf(`"%d %d %d * * *"`, due.Second(), due.Minute(), due.Hour())
	feeds := strings.SplitN(s, "    feeds:\n", 2)
	orders := feeds[1]
	stock := strings.Replace(strings.Replace(orders, "name: orders", "name: stock", 1), `'orders-.*\.csv'`, `'stock-.*\.csv'`, 1)
	s = feeds[0] + "    feeds:\n" +
		strings.Replace(orders, "        target: orders\n", "        target: orders\n        expect: {schedule: "+sched+", timezone: UTC, grace: 1s}\n", 1) +
		strings.Replace(stock, "        target: orders\n", "        target: orders\n        expect: {schedule: "+sched+", timezone: UTC, grace: 1s, calendar: "+cal+"}\n", 1)
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type lateRow struct {
	n, open  int64
	closedBy int64
}

func lateState(t *testing.T, pool *pgxpool.Pool, partner string) lateRow {
	t.Helper()
	var r lateRow
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE closed_intake_id IS NULL),
		coalesce(max(closed_intake_id), 0) FROM intake_feed_late WHERE partner_id = $1 AND feed = 'orders'`, partner).Scan(&r.n, &r.open, &r.closedBy); err != nil {
		t.Fatal(err)
	}
	return r
}

// On the real binary: two replicas watch a feed due once
// a day a few seconds from now. The window closes without a file: it is
// recorded once, counted once across the replicas, and intake_feed_late is
// 1 on both, while a second feed whose calendar lists the day is decided
// without a late window; replica a SIGKILLed and restarted forgets nothing and raises
// nothing again; `intake status` says so; then the file arrives, closes
// the window late and intake_feed_late falls to 0.
func TestAMissedDeliveryWindowIsRaisedOnceAndClosedByTheLateFile(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url) // for the in-process status command
	site := testenv.NewSite(t, "late")
	spoolDir := t.TempDir()
	due := time.Now().Add(8 * time.Second).Truncate(time.Second)
	addrA, addrB := freeAddr(t), freeAddr(t)
	cfgA := expectConfig(t, site, "a", spoolDir, addrA, due)
	cfgB := expectConfig(t, site, "b", spoolDir, addrB, due)
	a := startIntake(t, url, "", "run", "--config", cfgA)
	b := startIntake(t, url, "", "run", "--config", cfgB)

	// The feed is watched from before the window.
	waitFor(t, time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_feed_expect WHERE partner_id = $1`, site.Config.ID) == 2
	}, a, b)
	if testenv.Count(t, pool, `SELECT count(*) FROM intake_feed_expect WHERE partner_id = $1 AND since < $2`, site.Config.ID, due) != 2 {
		t.Fatalf("the daemons started watching the feed after the window was due (%s); the machine is too slow for this test", due)
	}

	// The window closes without a file.
	waitFor(t, time.Minute, func() bool {
		ga, okA := scrape(addrA, "intake_feed_late")
		gb, okB := scrape(addrB, "intake_feed_late")
		return okA && okB && ga == 1 && gb == 1
	}, a, b)
	if r := lateState(t, pool, site.Config.ID); r.n != 1 || r.open != 1 {
		t.Fatalf("late windows recorded: %+v, want one open", r)
	}
	// the stock feed's day is in its calendar: its window is decided, and nothing raised
	waitFor(t, time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_feed_expect WHERE partner_id = $1 AND feed = 'stock' AND last_scheduled >= $2`,
			site.Config.ID, due) == 1
	}, a, b)
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_feed_late WHERE feed = 'stock'`); n != 0 {
		t.Fatalf("a calendar day raised %d window(s)", n)
	}
	ra, _ := scrape(addrA, "intake_feed_late_windows_total")
	rb, _ := scrape(addrB, "intake_feed_late_windows_total")
	if ra+rb != 1 {
		t.Fatalf("intake_feed_late_windows_total: a %v + b %v, want 1", ra, rb)
	}

	// a dies and comes back: the window is still late, and raised by nobody again.
	a.signal(syscall.SIGKILL)
	a.wait(t, time.Minute)
	a = startIntake(t, url, "", "run", "--config", cfgA)
	waitFor(t, time.Minute, func() bool {
		ok, up := scrape(addrA, "intake_expect_last_success_timestamp_seconds")
		g, _ := scrape(addrA, "intake_feed_late")
		return up && ok > 0 && g == 1
	}, a)
	if r := lateState(t, pool, site.Config.ID); r.n != 1 || r.open != 1 {
		t.Fatalf("after a's restart: %+v, want the one window, still open", r)
	}
	if ra, _ := scrape(addrA, "intake_feed_late_windows_total"); ra != 0 {
		t.Fatalf("a raised the window again after its restart: %v", ra)
	}
	code, out := runCLI("status", "--config", cfgB)
	if code != 1 || !strings.Contains(out, "late delivery: feed orders") {
		t.Fatalf("status (exit %d) does not report the late window:\n%s", code, out)
	}

	// The file arrives late: it is taken as usual and closes the window.
	site.Drop(t, "orders-late.csv", testenv.OrdersCSV("L", 3))
	waitFor(t, time.Minute, func() bool { return lateState(t, pool, site.Config.ID).open == 0 }, a, b)
	var archived int64
	if err := pool.QueryRow(context.Background(), `SELECT intake_id FROM file_intake WHERE partner_id = $1 AND state = 'archived'`,
		site.Config.ID).Scan(&archived); err != nil {
		t.Fatal(err)
	}
	if r := lateState(t, pool, site.Config.ID); r.n != 1 || r.closedBy != archived {
		t.Fatalf("want the window closed by intake %d: %+v", archived, r)
	}
	waitFor(t, time.Minute, func() bool {
		ga, _ := scrape(addrA, "intake_feed_late")
		gb, _ := scrape(addrB, "intake_feed_late")
		return ga == 0 && gb == 0
	}, a, b)
	if !strings.Contains(a.output()+b.output(), "late delivery arrived") {
		t.Fatalf("no replica logged the late arrival:\n%s\n%s", tail(a.output()), tail(b.output()))
	}
	code, out = runCLI("status", "--config", cfgB)
	if !strings.Contains(out, fmt.Sprintf("late delivery arrived: feed orders, window scheduled %s, intake %d", due.UTC().Format(time.RFC3339), archived)) ||
		strings.Contains(out, "late delivery: feed") {
		t.Fatalf("status (exit %d) after the late file:\n%s", code, out)
	}
	code, out = runCLI("expect", "--config", cfgB, "--count", "2")
	if code != 0 || !strings.Contains(out, "late orders:") || !strings.Contains(out, "late stock:") ||
		strings.Count(out, "late unless a file is claimed by") != 3 || strings.Count(out, "no delivery (calendar day)") != 1 {
		t.Fatalf("intake expect (exit %d):\n%s", code, out)
	}
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	a.wait(t, time.Minute)
	b.wait(t, time.Minute)
}

// intake expect lists a daily 02:30 Berlin delivery once per day across
// both daylight-saving changes: at 03:00 on the spring-forward day, at the
// first 02:30 on the fall-back day.
func TestExpectListsDeliveriesAcrossDaylightSavingChanges(t *testing.T) {
	site := testenv.NewSite(t, "dst")
	p := writeConfigOpts(t, site, cfgOpts{worker: "a", poll: "@every 1s", schedule: "@every 1h", spool: t.TempDir()})
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(raw), "        target: orders\n", "        target: orders\n        expect: {schedule: \"30 2 * * *\", timezone: Europe/Berlin, grace: 1h}\n", 1)
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, want string }{
		{"2027-03-27T12:00:00Z", "Sun 2027-03-28 03:00:00 CEST  late unless a file is claimed by Sun 2027-03-28 04:00:00 CEST"},
		{"2027-10-30T12:00:00Z", "Sun 2027-10-31 02:30:00 CEST  late unless a file is claimed by Sun 2027-10-31 02:30:00 CET"},
	} {
		code, out := runCLI("expect", "--config", p, "--count", "2", "--from", tc.from)
		if code != 0 || !strings.Contains(out, tc.want) || strings.Count(out, "late unless a file is claimed by") != 2 {
			t.Fatalf("intake expect --from %s (exit %d), want %q:\n%s", tc.from, code, tc.want, out)
		}
	}
}
