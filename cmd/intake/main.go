// Command intake takes partner files from SFTP drop sites and lands their
// rows in PostgreSQL exactly once in effect.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/partner-intake/partner-intake/internal/pgerr"
)

const usage = `intake: partner files from SFTP into PostgreSQL, exactly once in effect.

Usage:
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

The database URL is read from the environment variable named by database.url_env
(default INTAKE_DATABASE_URL) unless database.url is set.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
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

// newLogger logs JSON, or text when w is a terminal.
func newLogger(w io.Writer) *slog.Logger {
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			return slog.New(slog.NewTextHandler(w, logOptions))
		}
	}
	return slog.New(slog.NewJSONHandler(w, logOptions))
}
