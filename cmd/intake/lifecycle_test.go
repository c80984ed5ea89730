package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// SIGTERM drains: claiming stops, the file in flight finishes (its
// context is the daemon's own, which the signal does not cancel), then
// the parts stop in reverse order and the run exits 0.
func TestSigtermLetsTheFileInFlightFinish(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "drain")
	cfg := writeConfigOpts(t, site, cfgOpts{chunkRows: 2})
	if code, out := runCLI("migrate", "--config", cfg); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	site.Drop(t, "orders-d.csv", testenv.OrdersCSV("D", 5))
	if err := fault.Set("apply:mid_chunk=pause@2"); err != nil {
		t.Fatal(err)
	}
	defer fault.Set("")
	logs := &proc{}
	done := make(chan int, 1)
	go func() { done <- run([]string{"run", "--config", cfg}, logs, logs) }()
	select {
	case <-fault.Paused("apply:mid_chunk"):
	case code := <-done:
		t.Fatalf("run exited %d before the file was in flight:\n%s", code, logs.output())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the file never reached its second chunk:\n%s", logs.output())
	}
	// run has caught SIGTERM since before it started the daemon
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, func() bool { return strings.Contains(logs.output(), "signal received: draining") })
	fault.Resume("apply:mid_chunk")
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run exited %d:\n%s", code, logs.output())
		}
	case <-time.After(time.Minute):
		t.Fatalf("run did not stop:\n%s", logs.output())
	}
	fs := testenv.Files(t, pool, "drain")
	if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 5 {
		t.Fatalf("files %+v: want the file in flight archived with its 5 rows", fs)
	}
	out := logs.output()
	for _, w := range []string{"daemon stopped", "serving /metrics"} {
		if !strings.Contains(out, w) {
			t.Fatalf("output lacks %q:\n%s", w, out)
		}
	}
}

// SIGHUP reloads the config: a bad file is refused whole (the config in
// force is kept; a log line and intake_config_last_reload_successful say
// so), an added partner is polled, a removed one stops, and the daemon
// still stops cleanly on SIGTERM.
func TestSighupReloadsThePartners(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	a, b := testenv.NewSite(t, "rla"), testenv.NewSite(t, "rlb")
	path := writeConfigOpts(t, a, cfgOpts{worker: "rl-1", poll: "@every 1s"})
	onlyA, _ := os.ReadFile(path)
	head, blockA, _ := strings.Cut(string(onlyA), "partners:\n")
	bText, _ := os.ReadFile(writeConfigOpts(t, b, cfgOpts{poll: "@every 1s"}))
	_, blockB, _ := strings.Cut(string(bText), "partners:\n")
	head += "partners:\n"
	if code, out := runCLI("migrate", "--config", path); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	p := startIntake(t, url, "", "run", "--config", path)
	waitFor(t, time.Minute, func() bool { return strings.Contains(p.output(), "daemon started") }, p)
	m := regexp.MustCompile(`"addr":"([^"]+)"`).FindStringSubmatch(lineWith(p.output(), "serving /metrics"))
	if m == nil {
		t.Fatalf("no listen address logged:\n%s", p.output())
	}
	get := func(what string) string {
		res, err := http.Get("http://" + m[1] + what)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return string(body)
	}
	reload := func(cfg string, n int, want string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		p.signal(syscall.SIGHUP)
		waitFor(t, time.Minute, func() bool { return strings.Count(p.output(), want) == n }, p)
	}

	// a bad file: refused whole, partner A still served
	reload(strings.Replace(string(onlyA), "    feeds:", "    feed:", 1), 1, "config reload refused")
	if body := get("/metrics"); !strings.Contains(body, "intake_config_last_reload_successful 0") ||
		!strings.Contains(body, `intake_config_reloads_total{result="error"} 1`) {
		t.Fatalf("a refused reload is not in the metrics:\n%s", body)
	}
	a.Drop(t, "orders-a1.csv", testenv.OrdersCSV("RA", 3))
	waitFor(t, time.Minute, func() bool { return archived(t, pool, "rla") == 1 }, p)

	// B added: polled at once
	b.Drop(t, "orders-b1.csv", testenv.OrdersCSV("RB", 3))
	reload(head+blockA+blockB, 1, "config reloaded")
	waitFor(t, time.Minute, func() bool { return archived(t, pool, "rlb") == 1 }, p)
	if body := get("/metrics"); !strings.Contains(body, "intake_config_last_reload_successful 1") {
		t.Fatalf("a successful reload is not in the metrics:\n%s", body)
	}

	// A removed: its poller ends, /readyz no longer reports it, B goes on
	reload(head+blockB, 2, "config reloaded")
	waitFor(t, time.Minute, func() bool { return strings.Contains(p.output(), "partner removed by a reload") }, p)
	if body := get("/readyz"); strings.Contains(body, `"rla"`) || !strings.Contains(body, `"rlb"`) {
		t.Fatalf("readyz after A was removed: %s", body)
	}
	b.Drop(t, "orders-b2.csv", testenv.OrdersCSV("RC", 3))
	waitFor(t, time.Minute, func() bool { return archived(t, pool, "rlb") == 2 }, p)

	p.signal(syscall.SIGTERM)
	if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("intake run exited %v:\n%s", ws, tail(p.output()))
	}
	if !strings.Contains(p.output(), "daemon stopped") {
		t.Fatalf("no clean stop:\n%s", tail(p.output()))
	}
}

func archived(t *testing.T, pool *pgxpool.Pool, partner string) int64 {
	return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND state = 'archived'`, partner)
}

// A stop signal during a reload ends the reload (its context is the
// signal's) and the run drains then, not once the reload gave up on its
// own.
func TestAStopSignalEndsAReloadInProgress(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	hup := make(chan os.Signal, 1)
	reloading := make(chan struct{})
	reloadEnded := make(chan error, 1)
	reload := func(rctx context.Context) {
		close(reloading)
		<-rctx.Done() // a reload waiting on a site or the database
		reloadEnded <- rctx.Err()
	}
	code := make(chan int, 1)
	go func() {
		code <- runServices(ctx, func() {}, hup, reload, testenv.Logger(t), io.Discard, nil)
	}()
	hup <- syscall.SIGHUP
	<-reloading
	stop() // SIGTERM
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("the run exited %d, want 0", c)
		}
	case <-time.After(time.Minute):
		t.Fatal("the run did not drain while a reload waited")
	}
	if err := <-reloadEnded; !errors.Is(err, context.Canceled) {
		t.Fatalf("the reload ended with %v, want the stop's cancel", err)
	}
}

// A reload that a stop signal cuts short is abandoned, not refused: it
// says so at Info, and the reload metrics keep what the last finished
// reload said (no alert on intake_config_last_reload_successful while the
// daemon drains). A verdict on the file is a refusal, stop or not, and so
// is a cancel with no stop.
func TestAReloadCutShortByAStopIsNotARefusal(t *testing.T) {
	const path = "../../configs/intake.example.yaml"
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	cutShort := fmt.Errorf("partner acme: check target: %w", context.Canceled)
	verdict := errors.New("partner acme: feed orders: target table bench_orders has no column qty")
	for _, c := range []struct {
		name      string
		stop      context.Context
		err       error
		abandoned bool
	}{
		{"cut short by the stop", stopped, cutShort, true},
		{"a verdict on the file during the stop", stopped, verdict, false},
		{"a cancel with no stop", context.Background(), cutShort, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			logs := &proc{}
			log := slog.New(slog.NewTextHandler(logs, nil))
			r := newReloader(path, cfg, nil, nil, expect.New(nil, cfg.WorkerID, cfg.ExpectCheck, cfg.Partners, reg, log),
				notify.New(nil, cfg.WorkerID, cfg.NotifyDelivery, cfg.Notify, cfg.Partners, reg, log), nil, nil, reg, log)
			r.failed(c.stop, c.err)
			lastOK, refusals, out := testutil.ToFloat64(r.lastOK), testutil.ToFloat64(r.reloads.WithLabelValues("error")), logs.output()
			if c.abandoned {
				if lastOK != 1 || refusals != 0 || !strings.Contains(out, `level=INFO msg="config reload abandoned`) || strings.Contains(out, "refused") {
					t.Fatalf("last_reload_successful %v, reloads{error} %v, log:\n%s\nwant abandoned: 1, 0, at Info", lastOK, refusals, out)
				}
				return
			}
			if lastOK != 0 || refusals != 1 || !strings.Contains(out, `level=ERROR msg="config reload refused`) {
				t.Fatalf("last_reload_successful %v, reloads{error} %v, log:\n%s\nwant refused: 0, 1, at Error", lastOK, refusals, out)
			}
		})
	}
}
