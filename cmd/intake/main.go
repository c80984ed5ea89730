// Command intake takes partner files from SFTP drop sites and lands their
// rows in PostgreSQL exactly once in effect.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/partner-intake/partner-intake/internal/pgerr"
)

const usage = `intake: partner files from SFTP into PostgreSQL, exactly once in effect.

Usage:
  intake [--log-level L] [--log-format F] COMMAND [flags]
  intake version | --version        print version, commit and Go version
  intake demo [--once]              run the built-in demo (throwaway PostgreSQL, in-process SFTP site)
  intake run --config FILE [--once] run the daemon (applies migrations first)
  intake migrate --config FILE      apply the database schema (idempotent, safe with several replicas)
  intake check --config FILE        validate the config, probe every partner, the database and target tables
  intake reconcile --config FILE    run the failure-matrix reconciler once; exit 1 when something needs a human
  intake quarantine list|show ID|release ID|discard ID --config FILE [--reason "…"] [--actor A] [--winner new|old]
                                    review held files; every decision is audited
  intake replay INTAKE_ID --config FILE --reason "…"
                                    apply a finished file's spooled bytes again (idempotent, audited)
  intake purge --config FILE        delete spool files, row issues, reports and audit rows past their retention
  intake audit --config FILE [--partner P]
                                    list audited ops actions
  intake status --config FILE [--partner P]
                                    files by state, oldest ready/processing, open quarantine, last poll,
                                    last reconciler findings; exit 1 when something needs attention

Global flags (before or after COMMAND):
  --log-level debug|info|warn|error log level (default info)
  --log-format json|text            log format (default: text on a terminal, else JSON)

Exit codes: 0 ok; 1 needs attention (a finding, a failed poll, an unreachable
database); 2 usage or config error.

The database URL is read from the environment variable named by database.url_env
(default INTAKE_DATABASE_URL) unless database.url is set.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	lc, args, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintf(stderr, "intake: %v\n\n%s", err, usage)
		return 2
	}
	logCfg.Store(&lc)
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "version", "--version", "-version":
		return cmdVersion(rest, stdout, stderr)
	case "demo":
		return cmdDemo(rest, stdout, stderr)
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "migrate":
		return cmdMigrate(rest, stdout, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "reconcile":
		return cmdReconcile(rest, stdout, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "quarantine":
		return cmdQuarantine(rest, stdout, stderr)
	case "replay":
		return cmdReplay(rest, stdout, stderr)
	case "audit":
		return cmdAudit(rest, stdout, stderr)
	case "purge":
		return cmdPurge(rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "intake: unknown command %q\n\n%s", cmd, usage)
	return 2
}

// logOptions reduce every logged error to codes: PostgreSQL's texts quote
// cell values, and values never leave the database (intake.Redact).
var logOptions = &slog.HandlerOptions{ReplaceAttr: pgerr.ReplaceAttr}

// logConfig is what the global --log-level and --log-format chose.
type logConfig struct {
	level  slog.Level
	format string // "json", "text" or "" (text on a terminal, else JSON)
}

// logCfg is set by run before a command starts; commands build their
// logger with newLogger, which reads it.
var logCfg atomic.Pointer[logConfig]

// parseGlobal takes --log-level, --log-format (as "--flag value" or
// "--flag=value", one dash or two) out of args wherever they stand before
// a "--", so `intake --log-level debug run …` and `intake run … --log-level
// debug` both work; the commands' own flag sets never see them.
func parseGlobal(args []string) (logConfig, []string, error) {
	lc := logConfig{level: slog.LevelInfo}
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "log-level" && name != "log-format") {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return lc, nil, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "log-level":
			if err := lc.level.UnmarshalText([]byte(val)); err != nil || !validLevel(val) {
				return lc, nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", val)
			}
		case "log-format":
			if val != "json" && val != "text" {
				return lc, nil, fmt.Errorf("--log-format %q: want json or text", val)
			}
			lc.format = val
		}
	}
	return lc, rest, nil
}

func validLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// newLogger logs at the chosen level in the chosen format: JSON, or text
// when w is a terminal, unless --log-format says. Every handler keeps
// logOptions' ReplaceAttr, so errors stay redacted whatever the flags.
func newLogger(w io.Writer) *slog.Logger {
	lc := logConfig{level: slog.LevelInfo}
	if p := logCfg.Load(); p != nil {
		lc = *p
	}
	opts := *logOptions
	opts.Level = lc.level
	format := lc.format
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				format = "text"
			}
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, &opts))
	}
	return slog.New(slog.NewJSONHandler(w, &opts))
}
