package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestVersionCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"--log-level", "debug", "version"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errb.String())
		}
		got := out.String()
		if !strings.HasPrefix(got, "intake ") || !strings.Contains(got, runtime.Version()) || !strings.Contains(got, "commit ") {
			t.Fatalf("%v: %q lacks version, commit or Go version", args, got)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"version", "extra"}, &out, &errb); code != 2 {
		t.Fatalf("version extra: exit %d, want 2", code)
	}
}

func TestVersionFromLdflags(t *testing.T) {
	version, commit = "1.2.3", "0123456789abcdef0123"
	t.Cleanup(func() { version, commit = "", "" })
	v := currentVersion()
	if v.Version != "1.2.3" || v.Commit != "0123456789ab" {
		t.Fatalf("got %+v, want version 1.2.3 and the commit cut to 12", v)
	}
}

func TestGlobalLogFlags(t *testing.T) {
	cases := []struct {
		args         []string
		level        string
		format, rest string
		bad          bool
	}{
		{args: []string{"run", "--config", "x"}, level: "INFO", rest: "run --config x"},
		{args: []string{"--log-level", "debug", "run", "--config", "x"}, level: "DEBUG", rest: "run --config x"},
		{args: []string{"run", "--config", "x", "--log-format=text", "-log-level=warn"}, level: "WARN", format: "text", rest: "run --config x"},
		{args: []string{"status", "--", "--log-level", "debug"}, level: "INFO", rest: "status -- --log-level debug"},
		{args: []string{"--log-level", "verbose", "run"}, bad: true},
		{args: []string{"--log-level", "warning", "run"}, bad: true},
		{args: []string{"--log-format", "xml", "run"}, bad: true},
		{args: []string{"run", "--log-level"}, bad: true},
	}
	for _, c := range cases {
		lc, rest, err := parseGlobal(c.args)
		if c.bad {
			if err == nil {
				t.Errorf("%v: accepted", c.args)
			}
			continue
		}
		if err != nil || lc.level.String() != c.level || lc.format != c.format || strings.Join(rest, " ") != c.rest {
			t.Errorf("%v: level %s format %q rest %q err %v; want %s %q %q", c.args, lc.level, lc.format, rest, err, c.level, c.format, c.rest)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"--log-format", "yaml", "version"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--log-format") {
		t.Fatalf("bad --log-format: exit %d, stderr %q; want 2 naming the flag", code, errb.String())
	}
}

// The chosen level filters, the chosen format holds, and errors stay
// redacted to codes whichever handler the flags pick.
func TestLoggerHonoursFlagsAndRedacts(t *testing.T) {
	t.Cleanup(func() { logCfg.Store(nil) })
	secret := fmt.Errorf("apply chunk: %w", &pgconn.PgError{Code: "23505", Message: "duplicate key value violates unique constraint",
		Detail: "Key (email)=(alice@example.com) already exists.", ConstraintName: "orders_email_key"})
	for _, format := range []string{"json", "text"} {
		lc, _, err := parseGlobal([]string{"--log-level", "warn", "--log-format", format})
		if err != nil {
			t.Fatal(err)
		}
		logCfg.Store(&lc)
		var buf bytes.Buffer
		log := newLogger(&buf)
		log.Info("hidden at warn")
		log.Warn("shown", "err", secret)
		got := buf.String()
		if strings.Contains(got, "hidden at warn") || !strings.Contains(got, "shown") {
			t.Fatalf("%s: level not applied: %q", format, got)
		}
		if strings.Contains(got, "alice@example.com") || !strings.Contains(got, "SQLSTATE 23505") {
			t.Fatalf("%s: a cell value reached the log: %q", format, got)
		}
		if (format == "json") != strings.HasPrefix(got, "{") {
			t.Fatalf("%s: wrong format: %q", format, got)
		}
	}
}

// run without --config reads $INTAKE_CONFIG: a file that is not there is
// a config error (exit 2) naming it.
func TestRunWithoutConfigReadsINTAKE_CONFIG(t *testing.T) {
	missing := t.TempDir() + "/absent.yaml"
	t.Setenv("INTAKE_CONFIG", missing)
	var out, errb bytes.Buffer
	if code := run([]string{"run"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), missing) {
		t.Fatalf("exit %d, stderr %q; want 2 naming %s", code, errb.String(), missing)
	}
}

// A fatal start-up error of `intake run` is one record of the selected log
// format: under --log-format json one JSON line carrying the error and the
// exit code, even when the error itself spans lines.
func TestRunFatalStartErrorIsOneRecordOfTheLogFormat(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.yaml")
	// two unknown keys: the config error names both, on lines of its own
	if err := os.WriteFile(cfg, []byte("worker_id: x\nnot_a_key: 1\nnor_this: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"--log-format", "json", "run", "--config", cfg}, &out, &errb)
	if code != 2 {
		t.Fatalf("exit %d, want 2: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimRight(errb.String(), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("stderr is %d lines, want one JSON line:\n%s", len(lines), errb.String())
	}
	var rec struct {
		Level    string `json:"level"`
		Msg      string `json:"msg"`
		Err      string `json:"err"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("stderr is not JSON: %v: %s", err, lines[0])
	}
	if rec.Level != "ERROR" || rec.ExitCode != 2 || !strings.Contains(rec.Err, "not_a_key") || !strings.Contains(rec.Err, cfg) {
		t.Fatalf("record %+v: want level ERROR, exit_code 2 and the config error naming the key and file", rec)
	}

	errb.Reset()
	if code := run([]string{"--log-format", "text", "run", "--config", cfg}, &out, &errb); code != 2 ||
		strings.Count(strings.TrimRight(errb.String(), "\n"), "\n") != 0 || !strings.HasPrefix(errb.String(), "time=") ||
		!strings.Contains(errb.String(), "exit_code=2") {
		t.Fatalf("--log-format text: exit %d, want 2 and one text record:\n%s", code, errb.String())
	}
}
