package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The release binary (built without tags, as `make static` builds what
// packages and images ship) has no switches in its environment: fault
// injection (INTAKE_FAULTS, the faults tag) and CPU profiling
// (INTAKE_CPUPROFILE, the cpuprofile tag) are compiled in only with their
// tags. Each check below also runs the tagged build, where the switch
// works, so a tag scheme that stopped working would fail here.

// releaseBinary is intake built without build tags.
func releaseBinary(t *testing.T) string { return buildIntake(t, "") }

// runBinary runs bin to completion with env added to this process's.
func runBinary(t *testing.T, bin string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

func TestReleaseBinaryCarriesNeitherSwitch(t *testing.T) {
	rel := releaseBinary(t)
	relSyms := symbols(t, rel)
	for _, sw := range []struct {
		env, tags string
		syms      []string
	}{
		{fault.Env, "faults", []string{
			"github.com/partner-intake/partner-intake/internal/fault.Check",
			"github.com/partner-intake/partner-intake/internal/fault.Set",
		}},
		{"INTAKE_CPUPROFILE", "cpuprofile", []string{"runtime/pprof.StartCPUProfile"}},
	} {
		tagged := buildIntake(t, sw.tags)
		// A variable whose name is not in the binary cannot be read by it.
		if contains(t, rel, sw.env) {
			t.Errorf("the release binary contains %s", sw.env)
		}
		if !contains(t, tagged, sw.env) {
			t.Errorf("the %s binary lacks %s", sw.tags, sw.env)
		}
		taggedSyms := symbols(t, tagged)
		for _, sym := range sw.syms {
			if relSyms[sym] {
				t.Errorf("the release binary links %s", sym)
			}
			if !taggedSyms[sym] {
				t.Errorf("the %s binary does not link %s", sw.tags, sym)
			}
		}
	}
}

// contains reports whether the file bin holds the bytes of s.
func contains(t *testing.T, bin, s string) bool {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte(s))
}

// symbols is the set of text (code) symbols of a binary (go tool nm).
func symbols(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm %s: %v", bin, err)
	}
	syms := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && (f[1] == "T" || f[1] == "t") {
			syms[f[2]] = true
		}
	}
	return syms
}

func TestReleaseBinaryIgnoresIntakeFaults(t *testing.T) {
	for _, spec := range []string{"garbage", "claim:after_rename=kill"} {
		code, out, errb := runBinary(t, releaseBinary(t), []string{fault.Env + "=" + spec}, "version")
		if code != 0 || !strings.HasPrefix(out, "intake ") {
			t.Errorf("release binary, %s=%s: intake version exited %d, stdout %q, stderr %q; want 0 and the version", fault.Env, spec, code, out, errb)
		}
	}
	code, _, errb := runBinary(t, intakeBinary(t), []string{fault.Env + "=garbage"}, "version")
	if code != 2 || !strings.Contains(errb, `"garbage" is not name=action`) {
		t.Errorf("faults binary, %s=garbage: exit %d, stderr %q; want 2 and the spec refused", fault.Env, code, errb)
	}
}

func TestReleaseBinaryIgnoresIntakeCPUProfile(t *testing.T) {
	for _, tc := range []struct {
		name, tags string
		written    bool
	}{{"release", "", false}, {"cpuprofile", "cpuprofile", true}} {
		dir := t.TempDir()
		prof := filepath.Join(dir, "cpu.pprof")
		// `intake run` starts the profile before it reads its config,
		// here one that does not exist.
		code, _, errb := runBinary(t, buildIntake(t, tc.tags), []string{"INTAKE_CPUPROFILE=" + prof}, "run", "--config", filepath.Join(dir, "missing.yaml"))
		if code != 2 || !strings.Contains(errb, "missing.yaml: no such file") {
			t.Fatalf("%s binary: intake run exited %d, stderr %q; want 2 and the missing config", tc.name, code, errb)
		}
		_, err := os.Stat(prof)
		if written := err == nil; written != tc.written {
			t.Errorf("%s binary: profile written %v, want %v (stat: %v)", tc.name, written, tc.written, err)
		}
	}
}

// TestReleaseBinaryRunsThroughAnArmedKill arms a kill at the claim of the
// first file: the faults build dies there, the release build claims, applies
// and archives every file and exits 0, and writes no CPU profile.
func TestReleaseBinaryRunsThroughAnArmedKill(t *testing.T) {
	const rows, chunkRows = 200, 100
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "rel")
	prefixes := dropFiles(t, site, 3, rows)
	spoolDir := t.TempDir()
	cfg := writeConfigOpts(t, site, cfgOpts{poll: "@every 1s", chunkRows: chunkRows, spool: spoolDir})
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	env := []string{"INTAKE_DATABASE_URL=" + url, fault.Env + "=claim:after_rename=kill", "INTAKE_CPUPROFILE=" + prof}

	p := startBinary(t, intakeBinary(t), env, "run", "--config", cfg, "--once")
	if ws := p.wait(t, time.Minute); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("faults binary: want death by SIGKILL at claim:after_rename, got %v:\n%s", ws, tail(p.output()))
	}
	if len(site.Files(t, "ready")) == 0 {
		t.Fatal("the faults binary claimed every file before it was killed: nothing left for the release binary to claim")
	}

	p = startBinary(t, releaseBinary(t), env, "run", "--config", cfg, "--once")
	if ws := p.wait(t, 2*time.Minute); ws.Signaled() || ws.ExitStatus() != 0 {
		t.Fatalf("release binary: run --once ended %v, want exit 0:\n%s", ws, tail(p.output()))
	}
	if strings.Contains(p.output(), "killing the process") {
		t.Fatalf("release binary: a fault fired:\n%s", tail(p.output()))
	}
	if _, err := os.Stat(prof); !os.IsNotExist(err) {
		t.Fatalf("release binary: INTAKE_CPUPROFILE was honoured (stat: %v)", err)
	}
	assertSettled(t, url, pool, site, cfg, spoolDir, rows, prefixes, chunkRows)
}
