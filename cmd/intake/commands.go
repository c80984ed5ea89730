package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// command is one `intake` subcommand: what its help, its usage errors and
// the shell completion say about it, and the function that runs it. The
// flags themselves are declared by the command's own function on a flag
// set from newFlags (one place per flag); help and completion read that
// set by asking the command for -h (flagsOf).
type command struct {
	name    string
	usage   string // what follows "intake NAME" in a synopsis
	summary string
	example string
	// required flags: each one missing is named in the error (exit 2).
	required []string
	// subs are sub-commands (quarantine list|show|…), with flags required
	// by some of them only.
	subs        []string
	subRequired map[string][]string
	// helpArgs reach the command's flag set before -h (replay wants an id first).
	helpArgs []string
	// hidden: left out of the usage text, the man page and the shell
	// completion (a command the build runs, not an operator).
	hidden bool
	run    func(args []string, stdout, stderr io.Writer) int
}

// commands is the registry, in the order of the usage text. Set in init:
// help and completion read it.
var commands []*command

func init() {
	commands = []*command{
		{name: "version", summary: "print version, commit and Go version (also --version)",
			example: "intake version", run: cmdVersion},
		{name: "demo", usage: "[--once]", summary: "run the built-in demo (throwaway PostgreSQL, in-process SFTP site; built with -tags demo)",
			example: "go run -tags demo ./cmd/intake demo --once", run: cmdDemo},
		{name: "run", usage: "--config FILE [--once]", summary: "run the daemon (applies migrations first)",
			required: []string{"config"}, example: "intake run --config /etc/intake/intake.yaml", run: cmdRun},
		{name: "migrate", usage: "[--config FILE]", summary: "apply the database schema (idempotent, safe with several replicas)",
			example: "INTAKE_DATABASE_URL=postgres://intake@db/intake intake migrate", run: cmdMigrate},
		{name: "check", usage: "--config FILE", summary: "validate the config, probe every partner, the database and target tables",
			required: []string{"config"}, example: "intake check --config /etc/intake/intake.yaml", run: cmdCheck},
		{name: "reconcile", usage: "--config FILE", summary: "run the failure-matrix reconciler once; exit 1 when something needs a human",
			required: []string{"config"}, example: "intake reconcile --config /etc/intake/intake.yaml", run: cmdReconcile},
		{name: "status", usage: "--config FILE [--partner P]", summary: "files by state, oldest claims, open quarantine, last poll and findings; exit 1 when something needs attention",
			required: []string{"config"}, example: "intake status --config /etc/intake/intake.yaml --partner acme", run: cmdStatus},
		{name: "expect", usage: "--config FILE [--partner P] [--count N] [--from TIME] | ack PARTNER/FEED WINDOW --config FILE --reason TEXT [--actor NAME]",
			summary:  "list the next delivery windows of every feed with an expect: block, calendar days marked; ack a late window no file will close (audited)",
			required: []string{"config"}, subRequired: map[string][]string{"ack": {"reason"}},
			example: "intake expect --config /etc/intake/intake.yaml --partner acme --count 10", run: cmdExpect},
		{name: "quarantine", usage: "list|show ID|release ID|discard ID --config FILE [--reason TEXT] [--actor NAME] [--winner new|old]",
			summary: "review held files; every decision is audited", subs: []string{"list", "show", "release", "discard"},
			required: []string{"config"}, subRequired: map[string][]string{"release": {"reason"}, "discard": {"reason"}},
			helpArgs: []string{"list"}, example: `intake quarantine release 42 --config /etc/intake/intake.yaml --reason "partner confirmed the resend"`,
			run: cmdQuarantine},
		{name: "plan", usage: "show ID --config FILE", summary: "show a file's plan against its target: counts, plan hash, a sample of changes (values on this terminal only)",
			subs: []string{"show"}, required: []string{"config"}, helpArgs: []string{"show", "1"},
			example: "intake plan show 42 --config /etc/intake/intake.yaml", run: cmdPlan},
		{name: "approve", usage: "ID --config FILE --plan-hash H --reason TEXT", summary: "approve the plan of a file awaiting approval (refused unless H is its current plan hash; audited)",
			required: []string{"config", "plan-hash", "reason"}, helpArgs: []string{"1"},
			example: `intake approve 42 --config /etc/intake/intake.yaml --plan-hash 3f9a… --reason "price list reviewed with the partner"`, run: cmdApprove},
		{name: "reject", usage: "ID --config FILE --reason TEXT", summary: "reject the plan of a file awaiting approval: the file is quarantined (plan_rejected); audited",
			required: []string{"config", "reason"}, helpArgs: []string{"1"},
			example: `intake reject 42 --config /etc/intake/intake.yaml --reason "snapshot would delete half the stock"`, run: cmdReject},
		{name: "replay", usage: "INTAKE_ID --config FILE --reason TEXT", summary: "apply a finished file's spooled bytes again (idempotent, audited)",
			required: []string{"config", "reason"}, helpArgs: []string{"1"},
			example: `intake replay 42 --config /etc/intake/intake.yaml --reason "mapping fixed"`, run: cmdReplay},
		{name: "notify", usage: "dead|redeliver --config FILE [--partner P] [--event ID|--all] [--url URL] [--endpoint ID] [--reason TEXT] [--actor NAME]",
			summary: "list webhook deliveries whose retry budget ran out, send them again (audited)", subs: []string{"dead", "redeliver"},
			required: []string{"config"}, subRequired: map[string][]string{"redeliver": {"reason"}}, helpArgs: []string{"dead"},
			example: `intake notify redeliver --config /etc/intake/intake.yaml --all --reason "endpoint fixed"`, run: cmdNotify},
		{name: "grants", usage: "--database NAME [--config FILE] [--daemon-role R] [--ops-role R] [--purge-role R] [--four-eyes]",
			summary: "print the SQL that gives the daemon's, the ops and the purge role only the rights their jobs need",
			example: "intake grants --database intake --ops-role intake_ops | psql -d intake -U intake_owner", run: cmdGrants},
		{name: "purge", usage: "--config FILE", summary: "delete spool files, row issues, reports and audit rows past their retention",
			required: []string{"config"}, example: "intake purge --config /etc/intake/intake.yaml", run: cmdPurge},
		{name: "audit", usage: "--config FILE [--partner P]", summary: "list audited ops actions",
			required: []string{"config"}, example: "intake audit --config /etc/intake/intake.yaml --partner acme --limit 20", run: cmdAudit},
		{name: "healthcheck", usage: "[--url URL] [--ready] [--timeout D]", summary: "ask a running daemon's /healthz (or /readyz): exit 0 when it answers 2xx, else 1; for a container HEALTHCHECK or an exec probe",
			example: "intake healthcheck --url http://127.0.0.1:9464/healthz", run: cmdHealthcheck},
		{name: "completion", usage: "bash|zsh|fish", summary: "print the shell completion script",
			subs: []string{"bash", "zsh", "fish"}, example: "source <(intake completion bash)", run: cmdCompletion},
		{name: "man", summary: "print the manual page intake(1) in roff (the package installs it)", hidden: true,
			example: "intake man | gzip -9n >intake.1.gz", run: cmdMan},
		{name: "help", usage: "[COMMAND]", summary: "this text, or a command's flags with their defaults and an example",
			example: "intake help run", run: cmdHelp},
	}
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// newFlags is the flag set of a command (name is its flag set name:
// "run", "quarantine release"), kept for flagsOf. After a flag error it
// points at the command's help (run() answers -h itself).
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "run \"intake help %s\" for every flag of intake %s\n", strings.Fields(name)[0], name)
	}
	declaredMu.Lock()
	declared[strings.Fields(name)[0]] = fs
	declaredMu.Unlock()
	return fs
}

var (
	declaredMu sync.Mutex
	declared   = map[string]*flag.FlagSet{}
)

// configEnv names the config file when --config is not given; without it,
// defaultConfig (the package's and the image's path) is read.
const (
	configEnv     = "INTAKE_CONFIG"
	defaultConfig = "/etc/intake/intake.yaml"
)

func defaultConfigPath() string {
	if v := os.Getenv(configEnv); v != "" {
		return v
	}
	return defaultConfig
}

// errMissing: a required flag was not given (the error named each one).
var errMissing = errors.New("missing required flags")

// parseFlags parses args and names every required flag that is missing,
// with the command's example, on the flag set's output.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	name := fs.Name()
	c := lookup(strings.Fields(name)[0])
	if c == nil {
		return nil
	}
	req := c.required
	if f := strings.Fields(name); len(f) > 1 {
		req = append(append([]string(nil), req...), c.subRequired[f[1]]...)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["config"] && fs.Lookup("config") != nil && slices.Contains(req, "config") {
		// A command that needs a config reads $INTAKE_CONFIG, else the
		// packaged path, when --config is not given.
		if err := fs.Set("config", defaultConfigPath()); err != nil {
			return err
		}
		set["config"] = true
	}
	missing := 0
	for _, r := range req {
		if set[r] {
			continue
		}
		missing++
		arg := ""
		if f := fs.Lookup(r); f != nil {
			arg = " " + argName(f)
		}
		fmt.Fprintf(fs.Output(), "intake %s: --%s%s is required\n", name, r, arg)
	}
	if missing > 0 {
		fmt.Fprintf(fs.Output(), "e.g. %s\n(intake help %s lists every flag)\n", c.example, c.name)
		return errMissing
	}
	return nil
}

// idArg takes the intake id that leads args ("intake approve 42 --…").
func idArg(cmd string, args []string, stderr io.Writer) (int64, []string, bool) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "intake %s: give the intake id first (intake help %s)\n", cmd, strings.Fields(cmd)[0])
		return 0, nil, false
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		fmt.Fprintf(stderr, "intake %s: %q is not an intake id\n", cmd, args[0])
		return 0, nil, false
	}
	return id, args[1:], true
}

// flagsOf is the flag set a command declares, got by running it with -h
// (output discarded): the flag package answers -h before the command does
// anything. nil for a command without flags.
func flagsOf(c *command) *flag.FlagSet {
	if c.name == "help" || c.name == "completion" || c.name == "man" {
		return nil
	}
	declaredMu.Lock()
	fs := declared[c.name]
	declaredMu.Unlock()
	if fs != nil {
		return fs
	}
	c.run(append(append([]string(nil), c.helpArgs...), "-h"), io.Discard, io.Discard)
	declaredMu.Lock()
	defer declaredMu.Unlock()
	return declared[c.name]
}

// argNames are the placeholders of flags whose value is not self-evident.
var argNames = map[string]string{"config": "FILE", "partner": "ID", "reason": "TEXT", "actor": "NAME", "winner": "new|old", "limit": "N",
	"database": "NAME", "daemon-role": "ROLE", "ops-role": "ROLE", "purge-role": "ROLE"}

func argName(f *flag.Flag) string {
	if isBool(f) {
		return ""
	}
	if n, ok := argNames[f.Name]; ok {
		return n
	}
	n, _ := flag.UnquoteUsage(f)
	return strings.ToUpper(n)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// printHelp is a command's help: synopsis, every flag with its default
// (or that it is required), the global flags and an example.
func printHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "intake %s: %s\n\nUsage:\n  intake %s %s\n", c.name, c.summary, c.name, c.usage)
	if fs != nil {
		required := map[string]string{}
		for _, r := range c.required {
			required[r] = "required"
		}
		if _, ok := required["config"]; ok {
			required["config"] = "default: $" + configEnv + ", else " + defaultConfig
		}
		bySub := map[string][]string{}
		for _, sub := range c.subs {
			for _, r := range c.subRequired[sub] {
				bySub[r] = append(bySub[r], sub)
			}
		}
		for r, subs := range bySub {
			if _, ok := required[r]; !ok {
				required[r] = "required by " + strings.Join(subs, " and ")
			}
		}
		fmt.Fprintln(w, "\nFlags:")
		var rows [][2]string
		fs.VisitAll(func(f *flag.Flag) {
			left := "--" + f.Name
			if a := argName(f); a != "" {
				left += " " + a
			}
			_, use := flag.UnquoteUsage(f)
			rows = append(rows, [2]string{left, use + " (" + defaultOf(f, required) + ")"})
		})
		printRows(w, rows)
	}
	fmt.Fprintln(w, "\nGlobal flags (before or after the command):")
	printRows(w, [][2]string{
		{"--log-level LEVEL", "debug, info, warn or error (default: info)"},
		{"--log-format FORMAT", "json or text (default: text on a terminal, else json)"},
	})
	fmt.Fprintf(w, "\nExample:\n  %s\n", c.example)
}

func defaultOf(f *flag.Flag, required map[string]string) string {
	if r, ok := required[f.Name]; ok {
		return r
	}
	if f.DefValue == "" {
		return "default: none"
	}
	return "default: " + f.DefValue
}

func printRows(w io.Writer, rows [][2]string) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], r[1])
	}
}

// usageText is `intake help`: every command with its synopsis.
func usageText() string {
	var b strings.Builder
	b.WriteString("intake: partner files from SFTP into PostgreSQL, exactly once in effect.\n\n")
	b.WriteString("Usage:\n  intake [--log-level L] [--log-format F] COMMAND [flags]\n\nCommands:\n")
	var rows [][2]string
	for _, c := range visibleCommands() {
		rows = append(rows, [2]string{c.name, c.summary})
	}
	printRows(&b, rows)
	b.WriteString(`
Run "intake help COMMAND" or "intake COMMAND -h" for a command's flags,
their defaults and an example.

Global flags (before or after COMMAND):
  --log-level debug|info|warn|error  log level (default info)
  --log-format json|text             log format (default: text on a terminal, else JSON)

Exit codes, the same for every command: 0 ok; 1 needs attention (a
finding, a failed poll, an unreachable database or partner); 2 usage or
config error (an unknown command or flag, a missing required flag, a config
file that does not load or validate).

The database URL is read from the environment variable named by database.url_env
(default INTAKE_DATABASE_URL) unless database.url is set.
`)
	return b.String()
}

// cmdHelp prints the usage, or one command's help.
func cmdHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stdout, usageText())
		return 0
	}
	c := lookup(args[0])
	if c == nil || len(args) > 1 {
		fmt.Fprintf(stderr, "intake help: no command %q\n\n%s", strings.Join(args, " "), usageText())
		return 2
	}
	printHelp(stdout, c, flagsOf(c))
	return 0
}

// wantsHelp: -h, -help or --help among args (before a "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// visibleCommands are the registry's commands an operator runs, in its
// order: the usage text, the man page and the completions list these.
func visibleCommands() []*command {
	var cs []*command
	for _, c := range commands {
		if !c.hidden {
			cs = append(cs, c)
		}
	}
	return cs
}

// commandNames, sorted (completion): the visible commands.
func commandNames() []string {
	var ns []string
	for _, c := range visibleCommands() {
		ns = append(ns, c.name)
	}
	sort.Strings(ns)
	return ns
}
