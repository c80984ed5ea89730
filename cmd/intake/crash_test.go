package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/spool"
)

// These tests run the real intake binary against real OpenSSH and
// PostgreSQL and kill it for real (SIGKILL, SIGSTOP), then check the
// invariants: every file ends archived, the target holds exactly the
// expected rows, outcome totals reconcile, no spool temp file remains and
// the reconciler finds nothing for a human.

var (
	binMu  sync.Mutex
	binDir string
	bins   = map[string]string{} // build tags -> binary
)

// buildIntake builds the intake binary with the build tags given ("" is
// the release build), once per tag list and test run.
func buildIntake(t *testing.T, tags string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if bin, ok := bins[tags]; ok {
		return bin
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "intake-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	bin := filepath.Join(binDir, fmt.Sprintf("intake-%d", len(bins)))
	out, err := exec.Command("go", "build", "-tags", tags, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -tags %q: %v\n%s", tags, err, out)
	}
	bins[tags] = bin
	return bin
}

// removeBinaries removes what buildIntake built (after the package's tests).
func removeBinaries() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// intakeBinary is the binary the crash tests kill: built with the faults
// tag, so INTAKE_FAULTS arms the fault hook (internal/fault).
func intakeBinary(t *testing.T) string { return buildIntake(t, "faults") }

// proc is a running intake process.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func startIntake(t *testing.T, url string, faults string, args ...string) *proc {
	t.Helper()
	return startBinary(t, intakeBinary(t), []string{"INTAKE_DATABASE_URL=" + url, fault.Env + "=" + faults}, args...)
}

// startBinary starts bin with args and env added to this process's.
func startBinary(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its wait status.
func (p *proc) wait(t *testing.T, limit time.Duration) syscall.WaitStatus {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("intake did not exit within %s:\n%s", limit, tail(p.output()))
	}
	return p.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func (p *proc) signal(sig syscall.Signal) { p.cmd.Process.Signal(sig) }

func tail(s string) string {
	if len(s) > 6000 {
		return "…" + s[len(s)-6000:]
	}
	return s
}

// runOnce runs `intake run --once` to completion and wants success.
func runOnce(t *testing.T, url, cfg string) {
	t.Helper()
	p := startIntake(t, url, "", "run", "--config", cfg, "--once")
	if ws := p.wait(t, 2*time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("run --once exited %v:\n%s", ws, tail(p.output()))
	}
}

// assertSettled checks the invariants after the dust settles.
func assertSettled(t *testing.T, url string, pool *pgxpool.Pool, site *testenv.Site, cfg, spoolDir string, rows int, prefixes []string, chunkRows int) {
	t.Helper()
	fs := testenv.Files(t, pool, site.Config.ID)
	if len(fs) != len(prefixes) {
		t.Fatalf("%d intake rows, want %d (one per file): %+v", len(fs), len(prefixes), fs)
	}
	for _, f := range fs {
		if f.State != "archived" || f.Applied+f.Unchanged+f.Rejected+f.Confl != f.Total || f.Total != int64(rows) {
			t.Fatalf("file %+v: want archived with totals reconciling to %d", f, rows)
		}
	}
	testenv.AssertExactOrders(t, pool, site.Config.ID, rows, prefixes...)
	chunks := (rows + chunkRows - 1) / chunkRows
	if got := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk`); got != int64(chunks*len(prefixes)) {
		t.Fatalf("ledger holds %d chunks, want %d", got, chunks*len(prefixes))
	}
	if got := site.Files(t, "ready"); len(got) != 0 {
		t.Fatalf("ready/ holds %v", got)
	}
	if got := site.Files(t, "processing"); len(got) != 0 {
		t.Fatalf("processing/ holds %v", got)
	}
	if got := site.Files(t, "archive"); len(got) != len(prefixes) {
		t.Fatalf("archive/ holds %v, want %d files", got, len(prefixes))
	}
	sp, _ := spool.New(spoolDir)
	if tmps, _ := sp.TempFiles(site.Config.ID, 0); len(tmps) != 0 {
		t.Fatalf("spool temp files left: %v", tmps)
	}
	rec := startIntake(t, url, "", "reconcile", "--config", cfg)
	if ws := rec.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("reconcile found something for a human (%v):\n%s", ws, rec.output())
	}
}

func dropFiles(t *testing.T, site *testenv.Site, n, rows int) []string {
	var prefixes []string
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("K%02d", i)
		site.Drop(t, fmt.Sprintf("orders-%02d.csv", i), testenv.OrdersCSV(p, rows))
		prefixes = append(prefixes, p)
	}
	return prefixes
}

func TestKillAtEachStepThenRestart(t *testing.T) {
	killAtEachStep(t, "crash", 3, 600, 200, []string{
		"claim:after_rename",
		"download:mid",
		"spool:after",
		"apply:mid_chunk=kill@2", // the first chunk is committed, the second is not
		"apply:after_commit",
		"archive:mid",
	})
}

// TestKillAtEachGroupStepThenRestart is the same for a group of small
// files (intake/group.go): killed at each of the group's steps, then run
// again, every file is applied exactly once and archived.
func TestKillAtEachGroupStepThenRestart(t *testing.T) {
	killAtEachStep(t, "gcrash", 6, 10, 10000, []string{
		"claim:after_rename",
		"download:mid",
		"spool:after",
		"apply:mid_chunk",
		"commit:reply_lost", // committed, then killed before anything else
		"apply:after_commit",
		"archive:mid",
	})
}

// TestKillAheadOfThePlanThenRestart is the same for a file large enough
// to be applied while it downloads (intake/ahead.go, 8 MiB and more):
// killed while its chunks wait in the transaction held open ahead, before
// that transaction's commit, and right after it, then run again, it is
// applied exactly once.
func TestKillAheadOfThePlanThenRestart(t *testing.T) {
	killAtEachStep(t, "acrash", 1, 160_000, 20_000, []string{
		"spool:after",        // downloaded; chunks applied ahead, not committed
		"apply:ahead_commit", // planned; the chunks applied ahead not committed
		"commit:reply_lost",  // the chunks applied ahead committed, then killed
	})
}

// killAtEachStep drops nfiles files of rows rows, kills `intake run` at
// each step (name[=spec], spec "kill" by default), runs it again once and
// checks that everything settled.
func killAtEachStep(t *testing.T, partner string, nfiles, rows, chunkRows int, steps []string) {
	for _, step := range steps {
		name, spec, _ := strings.Cut(step, "=")
		if spec == "" {
			spec = "kill"
		}
		t.Run(name, func(t *testing.T) {
			url, pool := testenv.DB(t)
			site := testenv.NewSite(t, partner)
			prefixes := dropFiles(t, site, nfiles, rows)
			spoolDir := t.TempDir()
			cfg := writeConfigOpts(t, site, cfgOpts{poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir})

			p := startIntake(t, url, name+"="+spec, "run", "--config", cfg)
			ws := p.wait(t, time.Minute)
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("want death by SIGKILL at %s, got %v:\n%s", name, ws, tail(p.output()))
			}
			if !strings.Contains(p.output(), "killing the process at "+name) {
				t.Fatalf("the fault did not fire at %s:\n%s", name, tail(p.output()))
			}
			runOnce(t, url, cfg)
			assertSettled(t, url, pool, site, cfg, spoolDir, rows, prefixes, chunkRows)
		})
	}
}

// envInt reads a soak knob from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestRandomKillSoak kills the daemon with SIGKILL at random moments while
// it works through many files. CI runs a small setting; by hand:
//
//	INTAKE_SOAK_KILLS=200 INTAKE_SOAK_FILES=100 go test -tags faults ./cmd/intake -run Soak -v -timeout 60m
//
// It runs over files of several chunks (the per-file path) and over small
// one-chunk files (groups, intake/group.go).
func TestRandomKillSoak(t *testing.T) {
	for _, tc := range []struct {
		name            string
		rows, chunkRows int
	}{{"chunked files", 400, 100}, {"small files in groups", 10, 10000}} {
		t.Run(tc.name, func(t *testing.T) { randomKillSoak(t, tc.rows, tc.chunkRows) })
	}
}

func randomKillSoak(t *testing.T, rows, chunkRows int) {
	kills := envInt("INTAKE_SOAK_KILLS", 8)
	nfiles := envInt("INTAKE_SOAK_FILES", 16)
	seed := uint64(time.Now().UnixNano())
	t.Logf("soak: %d kills over %d files, seed %d", kills, nfiles, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "soak")
	prefixes := dropFiles(t, site, nfiles, rows)
	spoolDir := t.TempDir()
	cfg := writeConfigOpts(t, site, cfgOpts{poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir, lease: "5s"})
	for i := 0; i < kills; i++ {
		p := startIntake(t, url, "", "run", "--config", cfg)
		// a random moment to kill at, the soak's subject; the daemon runs
		// until then
		at := time.NewTimer(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		select {
		case <-at.C:
		case <-p.done:
			t.Fatalf("the daemon exited before its kill: %v\n%s", p.err, p.output())
		}
		p.signal(syscall.SIGKILL)
		p.wait(t, 30*time.Second)
	}
	runOnce(t, url, cfg)
	assertSettled(t, url, pool, site, cfg, spoolDir, rows, prefixes, chunkRows)
}

// With affinity "none" every daemon claims from the partner, racing for
// each file; with the default one polls it and the others stand by.
func TestSeveralDaemonsApplyEachFileOnce(t *testing.T) {
	for _, tc := range []struct {
		n                       int
		affinity                string
		rows, chunkRows, nfiles int
	}{
		{2, "partner", 200, 100, 30},
		{3, "none", 200, 100, 30},
		{3, "none", 10, 10000, 100}, // small files: groups of 32 racing
	} {
		n, rows, chunkRows, nfiles := tc.n, tc.rows, tc.chunkRows, tc.nfiles
		t.Run(fmt.Sprintf("%d daemons, affinity %s, %d rows", n, tc.affinity, rows), func(t *testing.T) {
			url, pool := testenv.DB(t)
			site := testenv.NewSite(t, "multi")
			prefixes := dropFiles(t, site, nfiles, rows)
			spoolDir := t.TempDir()
			var cfg string
			var procs []*proc
			for i := 0; i < n; i++ {
				cfg = writeConfigOpts(t, site, cfgOpts{worker: fmt.Sprintf("node-%d", i), poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir, affinity: tc.affinity})
				procs = append(procs, startIntake(t, url, "", "run", "--config", cfg))
			}
			waitFor(t, 2*time.Minute, func() bool {
				return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE state = 'archived'`) == int64(nfiles)
			})
			for _, p := range procs {
				p.signal(syscall.SIGTERM)
			}
			workers := map[string]bool{}
			for _, p := range procs {
				if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
					t.Fatalf("daemon exited %v:\n%s", ws, tail(p.output()))
				}
			}
			for _, f := range testenv.Files(t, pool, "multi") {
				workers[f.Worker] = true
			}
			t.Logf("files were processed by %d of %d daemons", len(workers), n)
			assertSettled(t, url, pool, site, cfg, spoolDir, rows, prefixes, chunkRows)
		})
	}
}

// Row 5: a worker paused past its lease (SIGSTOP) is replaced; when it
// wakes (SIGCONT) its late writes are fenced out and it stops work on the
// file.
func TestPausedWorkerIsFencedOut(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "pause")
	const rows, chunkRows = 30000, 100
	prefixes := dropFiles(t, site, 1, rows)
	spoolDir := t.TempDir()
	cfgA := writeConfigOpts(t, site, cfgOpts{worker: "a", lease: "4s", poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir, schedule: "@every 1h"})
	cfgB := writeConfigOpts(t, site, cfgOpts{worker: "b", lease: "4s", poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir, schedule: "@every 1s"})
	a := startIntake(t, url, "", "run", "--config", cfgA)
	waitFor(t, time.Minute, func() bool { return testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk`) >= 3 })
	a.signal(syscall.SIGSTOP)
	b := startIntake(t, url, "", "run", "--config", cfgB)
	waitFor(t, 2*time.Minute, func() bool {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE state = 'archived' AND worker_id = 'b'`) == 1
	}, b)
	a.signal(syscall.SIGCONT)
	waitFor(t, time.Minute, func() bool {
		if strings.Contains(a.output(), "file lost to another owner") {
			return true
		}
		select {
		case <-a.done:
			t.Fatalf("a exited:\n%s", tail(a.output()))
		default:
		}
		return false
	}, a)
	a.signal(syscall.SIGTERM)
	b.signal(syscall.SIGTERM)
	a.wait(t, time.Minute)
	b.wait(t, time.Minute)
	if !strings.Contains(b.output(), "lease_expired") {
		t.Fatalf("b did not report the takeover:\n%s", tail(b.output()))
	}
	assertSettled(t, url, pool, site, cfgB, spoolDir, rows, prefixes, chunkRows)
}

// waitFor is testenv.WaitFor that shows the output of the processes given
// when the wait fails.
func waitFor(t *testing.T, limit time.Duration, cond func() bool, show ...*proc) {
	t.Helper()
	testenv.WaitFor(t, limit, cond, func() string {
		var out string
		for _, p := range show {
			out += "\n" + tail(p.output())
		}
		return out
	})
}
