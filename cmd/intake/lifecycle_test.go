package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

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

// SIGHUP no longer ends the daemon: it is logged (reload is not supported
// yet), and SIGTERM still stops the daemon cleanly afterwards.
func TestSighupIsLoggedNotFatal(t *testing.T) {
	url, _ := testenv.DB(t)
	site := testenv.NewSite(t, "hup")
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "hup-1"})
	p := startIntake(t, url, "", "run", "--config", cfg)
	waitFor(t, time.Minute, func() bool { return strings.Contains(p.output(), "daemon started") }, p)
	p.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, func() bool { return strings.Contains(p.output(), "SIGHUP received") }, p)
	p.signal(syscall.SIGTERM)
	if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("intake run exited %v:\n%s", ws, tail(p.output()))
	}
	if !strings.Contains(p.output(), "daemon stopped") {
		t.Fatalf("no clean stop:\n%s", tail(p.output()))
	}
}
