package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/rendezvous"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The episode found from outside: replica A is SIGKILLed
// right after its claim RENAMEs (before the rows exist), restarted while
// the partner's site is down, and stopped with SIGTERM before any poll of
// the partner got through. Its files in processing/A/ have no row. Until
// someone adopts them, `intake reconcile` and `intake status` say so; the
// stopped run does not record itself drained (it never looked at the
// partner); and the files are recovered: under affinity "partner" by A
// restarted (which, not polling the partner, used to trust the drained
// flag and never look), under affinity "none" by the other replica B once
// A is gone.
func TestClaimWithoutRowIsRecovered(t *testing.T) {
	for _, affinity := range []string{"partner", "none"} {
		t.Run("affinity "+affinity, func(t *testing.T) { claimWithoutRowIsRecovered(t, affinity) })
	}
}

func claimWithoutRowIsRecovered(t *testing.T, affinity string) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url) // for the in-process status command
	site := testenv.NewSite(t, "orphan")
	const rows = 10
	prefixes := dropFiles(t, site, 3, rows)
	spoolDir := t.TempDir()
	// B polls the partner when both are live (affinity "partner"): A is
	// the replica that does not, as in the episode.
	a, b := "", ""
	for i := 0; a == ""; i++ {
		x, y := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		if rendezvous.Owner(site.Config.ID, []string{x, y}) == y {
			a, b = x, y
		}
	}
	opts := func(worker string) cfgOpts {
		return cfgOpts{worker: worker, lease: "30s", poll: "@every 1s", schedule: "@every 1h", spool: spoolDir, affinity: affinity}
	}
	cfgA, cfgB, cfgOps := writeConfigOpts(t, site, opts(a)), writeConfigOpts(t, site, opts(b)), writeConfigOpts(t, site, opts("ops"))
	// the same A with its partner's site down (nothing listens there)
	raw, err := os.ReadFile(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	cfgADown := filepath.Join(t.TempDir(), "intake-down.yaml")
	if err := os.WriteFile(cfgADown, []byte(strings.Replace(string(raw), site.Config.SFTP.Address, "127.0.0.1:1", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	orphans := func() []string {
		var out []string
		filepath.WalkDir(filepath.Join(site.Root, "processing", a), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				out = append(out, d.Name())
			}
			return nil
		})
		return out
	}

	// 1. A claims and dies before the rows exist.
	pa := startIntake(t, url, "claim:after_rename=kill", "run", "--config", cfgA)
	if ws := pa.wait(t, time.Minute); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("want death by SIGKILL after the claim rename, got %v:\n%s", ws, tail(pa.output()))
	}
	left := orphans()
	if len(left) == 0 || testenv.Count(t, pool, `SELECT count(*) FROM file_intake`) != 0 {
		t.Fatalf("want claimed files without rows, got %v in processing/%s/ and %d rows", left, a,
			testenv.Count(t, pool, `SELECT count(*) FROM file_intake`))
	}

	// 2. Until they are adopted, reconcile and status report them (A's
	// lease still runs: it is live as far as anyone knows).
	rec := startIntake(t, url, "", "reconcile", "--config", cfgOps)
	if ws := rec.wait(t, time.Minute); ws.ExitStatus() != 1 || !strings.Contains(rec.output(), "orphan_claim") {
		t.Fatalf("reconcile exited %v, want 1 with an orphan_claim finding:\n%s", ws, rec.output())
	}
	code, out := runCLI("status", "--config", cfgOps)
	if want := fmt.Sprintf("ATTN orphan claims: %d file(s)", len(left)); code != 1 || !strings.Contains(out, want) {
		t.Fatalf("status exited %d, want 1 and %q:\n%s", code, want, out)
	}

	// 3. A comes back while the site is down, beside B, and is stopped
	// before any poll of the partner got through.
	pb := startIntake(t, url, "", "run", "--config", cfgB)
	pa = startIntake(t, url, "", "run", "--config", cfgADown)
	waitFor(t, time.Minute, func() bool { return strings.Contains(pa.output(), "poll failed") }, pa)
	pa.signal(syscall.SIGTERM)
	if ws := pa.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("A exited %v:\n%s", ws, tail(pa.output()))
	}
	// It never looked at the partner: it must not say it left nothing there.
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_worker WHERE worker_id = $1 AND drained_at IS NOT NULL`, a); n != 0 {
		t.Fatalf("a run that never reached the partner recorded itself drained")
	}

	// 4. Recovery.
	if affinity == "partner" {
		// A runs again and stays: B polls the partner; A must look into
		// its own processing dir all the same.
		pa = startIntake(t, url, "", "run", "--config", cfgA)
	} // else B, which polls the partner too, adopts what the stopped A left
	waitFor(t, 2*time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE state = 'archived'`) == int64(len(prefixes))
	}, pa, pb)
	if affinity == "none" {
		if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE worker_id = $1`, a); n != 0 {
			t.Fatalf("%d files done by the stopped A, want every one by B", n)
		}
	}
	for _, p := range []*proc{pa, pb} {
		p.signal(syscall.SIGTERM)
	}
	for _, p := range []*proc{pa, pb} {
		if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
			t.Fatalf("daemon exited %v:\n%s", ws, tail(p.output()))
		}
	}
	if got := orphans(); len(got) != 0 {
		t.Fatalf("processing/%s/ still holds %v", a, got)
	}
	assertSettled(t, url, pool, site, cfgOps, spoolDir, rows, prefixes, 10000)
	if code, out := runCLI("status", "--config", cfgOps); !strings.Contains(out, "orphan claims: 0 file(s)") {
		t.Fatalf("status (exit %d) still reports orphan claims:\n%s", code, out)
	}
}
