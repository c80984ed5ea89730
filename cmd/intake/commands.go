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

	"github.com/spf13/cobra"
)

// command is one `intake` subcommand: its cobra command (Use: its name
// and synopsis, Short: its summary, Example, Hidden: left out of the usage
// text, the man page and the completion, a command the build runs), what
// its help and usage errors say about its flags, and the function that
// runs it. The flags themselves are declared by the command's own
// function on a flag set from newFlags (one place per flag); help and
// completion read that set by asking the command for -h (flagsOf). Each
// command's entry is beside its function.
type command struct {
	*cobra.Command
	// required flags: each one missing is named in the error (exit 2).
	required []string
	// subs are sub-commands (quarantine list|show|…), with flags required
	// by some of them only.
	subs        []string
	subRequired map[string][]string
	// helpArgs reach the command's flag set before -h (replay wants an id first).
	helpArgs []string
	run      func(args []string, stdout, stderr io.Writer) int
}

// synopsis is what follows "intake NAME" in a synopsis.
func (c *command) synopsis() string {
	return strings.TrimSpace(strings.TrimPrefix(c.Use, c.Name()))
}

// commands is the registry, in the order of the usage text. Set in init:
// help and completion read it.
var commands []*command

func init() {
	commands = []*command{
		versionCommand,
		demoCommand,
		runCommand,
		migrateCommand,
		checkCommand,
		reconcileCommand,
		statusCommand,
		expectCommand,
		quarantineCommand,
		planCommand,
		approveCommand,
		rejectCommand,
		replayCommand,
		notifyCommand,
		grantsCommand,
		purgeCommand,
		auditCommand,
		healthcheckCommand,
		completionCommand,
		manCommand,
		helpCommand,
	}
}

// demoCommand is `intake demo`.
var demoCommand = &command{
	Command: &cobra.Command{
		Use:     "demo [--once]",
		Short:   "run the built-in demo (throwaway PostgreSQL, in-process SFTP site; built with -tags demo)",
		Example: "go run -tags demo ./cmd/intake demo --once",
	},
	run: cmdDemo,
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.Name() == name {
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
		fmt.Fprintf(fs.Output(), "e.g. %s\n(intake help %s lists every flag)\n", c.Example, c.Name())
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
	if c.Name() == "help" || c.Name() == "completion" || c.Name() == "man" {
		return nil
	}
	declaredMu.Lock()
	fs := declared[c.Name()]
	declaredMu.Unlock()
	if fs != nil {
		return fs
	}
	c.run(append(append([]string(nil), c.helpArgs...), "-h"), io.Discard, io.Discard)
	declaredMu.Lock()
	defer declaredMu.Unlock()
	return declared[c.Name()]
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
	fmt.Fprintf(w, "intake %s: %s\n\nUsage:\n  intake %s %s\n", c.Name(), c.Short, c.Name(), c.synopsis())
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
	fmt.Fprintf(w, "\nExample:\n  %s\n", c.Example)
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
		rows = append(rows, [2]string{c.Name(), c.Short})
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

// helpCommand is `intake help`.
var helpCommand = &command{
	Command: &cobra.Command{
		Use:     "help [COMMAND]",
		Short:   "this text, or a command's flags with their defaults and an example",
		Example: "intake help run",
	},
	run: cmdHelp,
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
		if !c.Hidden {
			cs = append(cs, c)
		}
	}
	return cs
}

// commandNames, sorted (completion): the visible commands.
func commandNames() []string {
	var ns []string
	for _, c := range visibleCommands() {
		ns = append(ns, c.Name())
	}
	sort.Strings(ns)
	return ns
}
