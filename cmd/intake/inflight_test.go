package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// stoppedAt waits until the process p has stopped itself at the fault
// step (the "stop" fault action: SIGSTOP) and is stopped in fact.
func stoppedAt(t *testing.T, p *proc, step string) {
	t.Helper()
	waitFor(t, 2*time.Minute, func() bool {
		if !strings.Contains(p.output(), "fault: stopping the process at "+step) {
			return false
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return false
		}
		// pid (comm) S ...: the state is the field after the last ')'
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return len(f) > 0 && f[0] == "T"
	}, p)
}

// clean runs intake reconcile and intake status and fails the test on
// anything either says needs a human.
func clean(t *testing.T, cfg, when string) {
	t.Helper()
	if code, out := runCLI("reconcile", "--config", cfg); code != 0 || strings.Contains(out, "ATTN") {
		t.Fatalf("%s: intake reconcile exit %d:\n%s", when, code, out)
	}
	if code, out := runCLI("status", "--config", cfg); code != 0 || strings.Contains(out, "ATTN") {
		t.Fatalf("%s: intake status exit %d:\n%s", when, code, out)
	}
}

// A file held for its reject rate and released keeps its reason file in
// quarantine/ until it is archived. While the real daemon applies it
// (stopped mid-chunk, and again after the move to archive/ before its
// row says archived), intake reconcile and intake status find nothing
// for a human; at the end the file is archived with every good row in,
// and its reason file is gone.
func TestAReleaseWhileTheFileAppliesLeavesReconcileAndStatusClean(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "relapply")
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "ra-1", poll: "@every 1s", schedule: "@every 1h", chunkRows: 500,
		feedExtra: "        max_reject_ratio: 0.1\n"})
	const rows = 10000
	var b strings.Builder
	b.WriteString(testenv.OrdersHeader)
	bad := 0
	for i := 1; i <= rows; i++ {
		email := fmt.Sprintf("c%d@example.com", i)
		if i%7 == 0 {
			email, bad = "not-an-email", bad+1
		}
		fmt.Fprintf(&b, "RA-%d,%s,%d.00,paid,2026-11-01T10:00:00Z,%d\n", i, email, i, i)
	}
	site.Drop(t, "orders-ra.csv", b.String())
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once: exit %d\n%s", code, out)
	}
	fs := testenv.Files(t, pool, "relapply")
	if len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != "reject_rate_exceeded" {
		t.Fatalf("files %+v, want one held for its reject rate", fs)
	}
	id := fs[0].ID
	if code, out := runCLI("quarantine", "release", strconv.FormatInt(id, 10), "--config", cfg, "--reason", "partner confirmed", "--actor", "ops"); code != 0 {
		t.Fatalf("release: exit %d\n%s", code, out)
	}
	// the released file waits for a reconciler: this one takes it over
	// as ra-1, the daemon's worker id, whose poll then applies it
	code, out := runCLI("reconcile", "--config", cfg)
	if code != 0 || !strings.Contains(out, "lease_expired") {
		t.Fatalf("reconcile after the release: exit %d\n%s", code, out)
	}
	daemon := startIntake(t, url, "apply:mid_chunk=stop@3,archive:mid=stop", "run", "--config", cfg)

	stoppedAt(t, daemon, "apply:mid_chunk")
	if f := liveRow(t, pool, id); f.state != "applying" {
		t.Fatalf("stopped mid-chunk in state %s", f.state)
	}
	if n := len(site.Files(t, "quarantine")); n != 1 {
		t.Fatalf("quarantine/ holds %d entries while the released file applies, want its reason file", n)
	}
	clean(t, cfg, "mid-apply")
	daemon.signal(syscall.SIGCONT)

	stoppedAt(t, daemon, "archive:mid")
	if f := liveRow(t, pool, id); f.state != "applied" {
		t.Fatalf("stopped while archiving in state %s", f.state)
	}
	clean(t, cfg, "mid-archive")
	daemon.signal(syscall.SIGCONT)

	waitFor(t, 2*time.Minute, func() bool { return liveRow(t, pool, id).state == "archived" }, daemon)
	if q := site.Files(t, "quarantine"); len(q) != 0 {
		t.Fatalf("quarantine/ holds %v after the file was archived", q)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'relapply'`); n != int64(rows-bad) {
		t.Fatalf("%d rows landed, want %d", n, rows-bad)
	}
	clean(t, cfg, "archived")
	daemon.signal(syscall.SIGTERM)
	if ws := daemon.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("the daemon exited %v:\n%s", ws, tail(daemon.output()))
	}
}
