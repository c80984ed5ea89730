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

	// The zone database inside the binary: the image is FROM scratch and a
	// host may lack /usr/share/zoneinfo, while configs name zones
	// (Europe/Berlin). The system's database is still used when present.
	_ "time/tzdata"

	"github.com/partner-intake/partner-intake/internal/pgerr"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the CLI: global flags, then the command by name, run through
// the cobra command tree (tree.go; each command's flags are its own, -h
// or --help prints its help). Exit codes, the same for every command: 0
// ok, 1 needs attention, 2 usage or config error.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	if completing(args) {
		// A shell asks for the candidates of a word (tree.go): the global
		// flags stay where they are, cobra and the completions read them.
		return execute(root, args)
	}
	lc, args, err := parseGlobal(args)
	if err != nil {
		fmt.Fprintf(stderr, "intake: %v\n\n%s", err, usageText(root))
		return 2
	}
	logCfg.Store(&lc)
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText(root))
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "--version", "-version":
		name = "version"
	case "-h", "-help", "--help":
		name = "help"
	}
	if findCommand(root, name) == nil {
		fmt.Fprintf(stderr, "intake: unknown command %q\n%s\n%s", name, suggest(root, name), usageText(root))
		return 2
	}
	return execute(root, append([]string{name}, rest...))
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
