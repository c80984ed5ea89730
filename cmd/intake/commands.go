package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commands are intake's commands, in the order of the usage text: each
// builds its cobra command (Use: its name and synopsis, Short: its
// summary, Example, Hidden: left out of the usage text, the man page and
// the completion) with its flags declared on it and what it runs (runs).
// Each one is beside its function; the tree (tree.go) adds help.
var commands = []func() *cobra.Command{
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
}

// runs makes fn cmd's RunE: fn gets the arguments left after the flags
// and the tree's stdout and stderr, and returns the exit code.
func runs(cmd *cobra.Command, fn func(args []string, stdout, stderr io.Writer) int) *cobra.Command {
	cmd.DisableFlagsInUseLine = true // each Use spells its flags
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if code := fn(args, cmd.OutOrStdout(), cmd.ErrOrStderr()); code != 0 {
			return exitError(code)
		}
		return nil
	}
	return cmd
}

// demoCommand is `intake demo`.
func demoCommand() *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:     "demo [--once]",
		Short:   "run the built-in demo (throwaway PostgreSQL, in-process SFTP site; built with -tags demo)",
		Example: "go run -tags demo ./cmd/intake demo --once",
	}
	cmd.Flags().BoolVar(&once, "once", false, "exit after the example files are processed and summarised")
	return runs(cmd, func(_ []string, stdout, stderr io.Writer) int { return cmdDemo(once, stdout, stderr) })
}

// The annotations of a flag that help, the man page and checkFlags read
// (a flag every use of the command needs is cobra's MarkFlagRequired).
const (
	// annDefault: the default help shows, for one the flag's value is
	// not (--config's comes from the environment when the command runs).
	annDefault = "intake_default"
	// annRequiredBy: the sub-commands that need the flag.
	annRequiredBy = "intake_required_by"
	// annSubs (a command's annotation): its sub-commands, space-separated
	// (quarantine list|show|…), taken as its first argument.
	annSubs = "intake_subs"
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

// configFlag declares the --config a command needs: not given, it is
// $INTAKE_CONFIG, else defaultConfig (checkFlags sets it).
func configFlag(cmd *cobra.Command, p *string, usage string) {
	cmd.Flags().StringVar(p, "config", "", usage)
	cmd.Flags().SetAnnotation("config", annDefault, []string{"$" + configEnv + ", else " + defaultConfig})
}

// withConfig declares --config on cmd (usage "" for "config file
// (YAML)") and runs fn with its value: a command whose other flags, if
// any, cmd declares and fn's closure reads.
func withConfig(cmd *cobra.Command, usage string, fn func(path string, stdout, stderr io.Writer) int) *cobra.Command {
	var path string
	if usage == "" {
		usage = "config file (YAML)"
	}
	configFlag(cmd, &path, usage)
	return runs(cmd, func(_ []string, stdout, stderr io.Writer) int { return fn(path, stdout, stderr) })
}

// requiredBy declares that the sub-commands subs of cmd need the flag.
func requiredBy(cmd *cobra.Command, flag string, subs ...string) {
	cmd.Flags().SetAnnotation(flag, annRequiredBy, subs)
}

// subsOf are a command's sub-commands (its first argument).
func subsOf(cmd *cobra.Command) []string { return strings.Fields(cmd.Annotations[annSubs]) }

// checkFlags runs before every command (the root's PersistentPreRunE):
// --config takes its default, and every required flag that is missing
// (MarkFlagRequired, or required by the sub-command given) is named with
// the command's example; exit 2.
func checkFlags(cmd *cobra.Command, args []string) error {
	fs := cmd.Flags()
	if f := fs.Lookup("config"); f != nil && !f.Changed && f.Annotations[annDefault] != nil {
		if err := fs.Set("config", defaultConfigPath()); err != nil {
			return err
		}
	}
	name, sub := cmd.Name(), ""
	if len(args) > 0 && slices.Contains(subsOf(cmd), args[0]) {
		sub = args[0]
		name += " " + sub
	}
	missing := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || (f.Annotations[cobra.BashCompOneRequiredFlag] == nil && (sub == "" || !slices.Contains(f.Annotations[annRequiredBy], sub))) {
			return
		}
		missing++
		arg := ""
		if a := argName(f); a != "" {
			arg = " " + a
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "intake %s: --%s%s is required\n", name, f.Name, arg)
	})
	if missing > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "e.g. %s\n(intake help %s lists every flag)\n", cmd.Example, cmd.Name())
		return exitError(2)
	}
	return nil
}

// flagError is every command's answer to a flag it cannot parse (exit 2).
// A long flag given one dash (-config, as Go's flag package took it)
// reaches pflag as shorthands: the error says how to spell it.
func flagError(cmd *cobra.Command, err error) error {
	hint := ""
	if _, arg, ok := strings.Cut(err.Error(), " in -"); ok {
		name, _, _ := strings.Cut(arg, "=")
		if cmd.Flags().Lookup(name) != nil {
			hint = " (a long flag takes two dashes: --" + name + ")"
		}
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "intake %s: %v%s\nrun \"intake help %s\" for every flag of intake %s\n", cmd.Name(), err, hint, cmd.Name(), cmd.Name())
	return exitError(2)
}

// idArg takes the intake id that leads args ("intake approve 42 --…").
func idArg(cmd string, args []string, stderr io.Writer) (int64, bool) {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "intake %s: give the intake id (intake help %s)\n", cmd, strings.Fields(cmd)[0])
		return 0, false
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id <= 0 {
		fmt.Fprintf(stderr, "intake %s: %q is not an intake id\n", cmd, args[0])
		return 0, false
	}
	return id, true
}

// argNames are the placeholders of flags whose value is not self-evident.
var argNames = map[string]string{"config": "FILE", "partner": "ID", "reason": "TEXT", "actor": "NAME", "winner": "new|old", "hold": "TOKEN", "limit": "N",
	"database": "NAME", "daemon-role": "ROLE", "ops-role": "ROLE", "purge-role": "ROLE"}

func argName(f *pflag.Flag) string {
	if f.Value.Type() == "bool" {
		return ""
	}
	if n, ok := argNames[f.Name]; ok {
		return n
	}
	n, _ := pflag.UnquoteUsage(f)
	return strings.ToUpper(n)
}

// commandFlags are a command's own flags, in order of name, without
// cobra's --help (-h is in every command's help).
func commandFlags(cmd *cobra.Command) []*pflag.Flag {
	var fl []*pflag.Flag
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" {
			fl = append(fl, f)
		}
	})
	return fl
}

// flagDefault is what a command's help says of a flag's default: that it
// is required (by which sub-commands), its annotated default, or its value.
func flagDefault(cmd *cobra.Command, f *pflag.Flag) string {
	switch {
	case f.Annotations[cobra.BashCompOneRequiredFlag] != nil:
		return "required"
	case f.Annotations[annDefault] != nil:
		return "default: " + f.Annotations[annDefault][0]
	case f.Annotations[annRequiredBy] != nil:
		return "required by " + strings.Join(f.Annotations[annRequiredBy], " and ")
	case f.DefValue == "":
		return "default: none"
	}
	return "default: " + f.DefValue
}

// helpTemplate is cobra's help for every command: the usage text for
// intake itself, else the synopsis, every flag with its default (or that
// it is required), the global flags and an example.
const helpTemplate = `{{if .HasParent}}intake {{.Name}}: {{.Short}}

Usage:
  {{.UseLine}}
{{flagRows .}}
Global flags (before or after the command):
  --log-level LEVEL    debug, info, warn or error (default: info)
  --log-format FORMAT  json or text (default: text on a terminal, else json)

Example:
  {{.Example}}
{{else}}{{usageText .}}{{end}}`

func init() {
	cobra.AddTemplateFunc("flagRows", flagRows)
	cobra.AddTemplateFunc("usageText", usageText)
}

// flagRows is the Flags: section of a command's help, "" without flags.
func flagRows(cmd *cobra.Command) string {
	var rows [][2]string
	for _, f := range commandFlags(cmd) {
		left := "--" + f.Name
		if a := argName(f); a != "" {
			left += " " + a
		}
		_, use := pflag.UnquoteUsage(f)
		rows = append(rows, [2]string{left, use + " (" + flagDefault(cmd, f) + ")"})
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nFlags:\n")
	printRows(&b, rows)
	return b.String()
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

// usageText is `intake help`: every command of the tree with its synopsis.
func usageText(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString("intake: partner files from SFTP into PostgreSQL, exactly once in effect.\n\n")
	b.WriteString("Usage:\n  intake [--log-level L] [--log-format F] COMMAND [flags]\n\nCommands:\n")
	var rows [][2]string
	for _, c := range visibleCommands(root) {
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
file that does not load or validate); 3 an ops action refused, nothing
changed; 4 whether an ops action took effect is not known yet.

The database URL is read from the environment variable named by database.url_env
(default INTAKE_DATABASE_URL) unless database.url is set.
`)
	return b.String()
}

// helpCommand is `intake help`.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "help [COMMAND]",
		Short:   "this text, or a command's flags with their defaults and an example",
		Example: "intake help run",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				fmt.Fprint(cmd.OutOrStdout(), usageText(cmd.Root()))
				return nil
			}
			c := findCommand(cmd.Root(), args[0])
			if c == nil || len(args) > 1 {
				fmt.Fprintf(cmd.ErrOrStderr(), "intake help: no command %q\n\n%s", strings.Join(args, " "), usageText(cmd.Root()))
				return exitError(2)
			}
			return c.Help()
		},
	}
}

// findCommand is root's command named name, or nil.
func findCommand(root *cobra.Command, name string) *cobra.Command {
	for _, c := range root.Commands() {
		if c.Name() == name {
			return c
		}
	}
	return nil
}

// visibleCommands are the tree's commands an operator runs, in its
// order: the usage text, the man page and the completions list these.
func visibleCommands(root *cobra.Command) []*cobra.Command {
	var cs []*cobra.Command
	for _, c := range root.Commands() {
		if !c.Hidden && c.Name() != cobra.ShellCompRequestCmd && c.Name() != cobra.ShellCompNoDescRequestCmd {
			cs = append(cs, c)
		}
	}
	return cs
}

// commandNames, sorted (completion): the visible commands.
func commandNames(root *cobra.Command) []string {
	var ns []string
	for _, c := range visibleCommands(root) {
		ns = append(ns, c.Name())
	}
	sort.Strings(ns)
	return ns
}

// synopsis is what follows "intake NAME" in a synopsis.
func synopsis(cmd *cobra.Command) string {
	return strings.TrimSpace(strings.TrimPrefix(cmd.Use, cmd.Name()))
}
