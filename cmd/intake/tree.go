package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/migrations"
)

// exitError carries a command's exit code out of cobra's Execute.
type exitError int

func (e exitError) Error() string { return "exit " + strconv.Itoa(int(e)) }

// newRoot is the cobra command tree, built afresh from each command's
// entry (its Use, Short, Example beside its function): cobra runs each
// command (its own flag set parses its flags, so help, the required-flag
// errors and the exit codes are the registry's), answers the shells'
// __complete requests, generates the completion scripts and suggests a
// command for a mistyped one; the man page walks the same tree.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:                        "intake",
		Short:                      "partner files from SFTP into PostgreSQL, exactly once in effect",
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	// The global flags, for the completion of their values: run takes
	// them out of the arguments before cobra sees them (parseGlobal).
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().String("log-format", "", "log format: json or text")
	root.RegisterFlagCompletionFunc("log-level", fixedValues("debug", "info", "warn", "error"))
	root.RegisterFlagCompletionFunc("log-format", fixedValues("json", "text"))
	for _, c := range commands {
		cc := &cobra.Command{
			Use:                c.Use,
			Short:              c.Short,
			Example:            c.Example,
			Hidden:             c.Hidden,
			DisableFlagParsing: true,
			ValidArgsFunction:  completer(c),
			RunE: func(_ *cobra.Command, args []string) error {
				if code := c.run(args, stdout, stderr); code != 0 {
					return exitError(code)
				}
				return nil
			},
		}
		if c.Name() == "help" {
			root.SetHelpCommand(cc)
			continue
		}
		root.AddCommand(cc)
	}
	root.InitDefaultHelpCmd()
	return root
}

// The tree keeps the registry's order: the man page walks it.
func init() { cobra.EnableCommandSorting = false }

// registryOf is the registry's entry of a command of the tree.
func registryOf(cc *cobra.Command) *command { return lookup(cc.Name()) }

// execute runs args (after the global flags) through the tree.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return int(ee)
	default:
		fmt.Fprintf(stderr, "intake: %v\n", err)
		return 2
	}
}

// suggest is cobra's "did you mean" for a mistyped command, or "".
func suggest(name string) string {
	s := newRoot(io.Discard, io.Discard).SuggestionsFor(name)
	if len(s) == 0 {
		return ""
	}
	return "did you mean " + strings.Join(s, " or ") + "?\n"
}

// completionCommand is `intake completion`.
var completionCommand = &command{
	Command: &cobra.Command{
		Use:     "completion bash|zsh|fish",
		Short:   "print the shell completion script",
		Example: "source <(intake completion bash)",
	},
	subs: []string{"bash", "zsh", "fish"},
	run:  cmdCompletion,
}

// cmdCompletion prints cobra's completion script for bash, zsh or fish;
// the script asks `intake __complete` for each word, so it never lags
// behind the commands and their flags, and completes partner ids, feed
// names and intake ids (completer).
func cmdCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "intake completion: give the shell: bash, zsh or fish (e.g. source <(intake completion bash))")
		return 2
	}
	root := newRoot(stdout, stderr)
	var err error
	switch args[0] {
	case "bash":
		err = root.GenBashCompletionV2(stdout, true)
	case "zsh":
		err = root.GenZshCompletion(stdout)
	case "fish":
		err = root.GenFishCompletion(stdout, true)
	default:
		fmt.Fprintf(stderr, "intake completion: %q: only bash, zsh and fish\n", args[0])
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "intake completion:", err)
		return 1
	}
	return 0
}

func fixedValues(vs ...string) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return vs, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeTimeout bounds what completion may wait for the config and the
// database: a shell waits for it.
const completeTimeout = 2 * time.Second

// idStates are the states of the rows a command taking an intake id
// acts on, by command and sub-command.
var idStates = map[string][]string{
	"quarantine release": {"quarantined"},
	"quarantine discard": {"quarantined"},
	"quarantine show":    {"quarantined", "discarded"},
	"approve":            {"awaiting_approval"},
	"reject":             {"awaiting_approval"},
	"plan show":          {"awaiting_approval", "applied", "archived", "quarantined"},
	"replay":             {"archived", "applied"},
}

// completer completes one command's words: its sub-commands, its flags
// (from its own flag set), a flag's values (--config a file, --partner a
// partner id of the config, --feed a feed name, fixed sets) and the
// intake id a command takes first (from the database). Whatever cannot be
// read in time completes to nothing.
func completer(c *command) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		cs, d := complete(c, args, toComplete)
		if d&cobra.ShellCompDirectiveFilterFileExt != 0 {
			return cs, d
		}
		var out []cobra.Completion
		for _, s := range cs {
			if strings.HasPrefix(s, toComplete) {
				out = append(out, s)
			}
		}
		return out, d
	}
}

func complete(c *command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	none := cobra.ShellCompDirectiveNoFileComp
	fs := flagsOf(c)
	// words: args without flags and their values; configPath: --config.
	var words []string
	configPath := ""
	var prev *flag.Flag
	prevGlobal := false
	for i, a := range args {
		switch {
		case prevGlobal:
			prevGlobal = false
		case prev != nil:
			if prev.Name == "config" {
				configPath = a
			}
			prev = nil
		case strings.HasPrefix(a, "-"):
			name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if name == "log-level" || name == "log-format" {
				prevGlobal = !hasVal
				continue
			}
			if fs == nil {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBool(f) {
				if hasVal {
					if name == "config" {
						configPath = val
					}
				} else if i < len(args) {
					prev = f
				}
			}
		default:
			words = append(words, a)
		}
	}
	if prevGlobal {
		return nil, none
	}
	if prev != nil {
		switch prev.Name {
		case "config":
			return []cobra.Completion{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
		case "partner":
			return partnerIDs(configPath), none
		case "feed":
			return feedNames(configPath), none
		case "winner":
			return []cobra.Completion{"new", "old"}, none
		}
		return nil, none
	}
	if strings.HasPrefix(toComplete, "-") {
		var fl []cobra.Completion
		if fs != nil {
			fs.VisitAll(func(f *flag.Flag) {
				_, use := flag.UnquoteUsage(f)
				fl = append(fl, cobra.CompletionWithDesc("--"+f.Name, use))
			})
		}
		return append(fl, "--log-level", "--log-format"), none
	}
	switch {
	case c.Name() == "help":
		if len(words) == 0 {
			return commandNames(), none
		}
	case len(c.subs) > 0 && len(words) == 0:
		return c.subs, none
	}
	key := c.Name()
	if len(c.subs) > 0 && len(words) > 0 {
		key += " " + words[0]
		words = words[1:]
	}
	if st, ok := idStates[key]; ok && len(words) == 0 {
		return intakeIDs(configPath, st), none
	}
	if c.Name() == "expect" && len(words) == 0 {
		return []cobra.Completion{"ack"}, none
	}
	if c.Name() == "expect" && slices.Equal(words, []string{"ack"}) {
		return partnerFeeds(configPath), none
	}
	return nil, none
}

// loadForCompletion is the config a completion reads: --config, else
// $INTAKE_CONFIG, else the packaged path; nil when it does not load.
func loadForCompletion(path string) *config.File {
	if path == "" {
		path = defaultConfigPath()
	}
	f, err := config.Load(path)
	if err != nil {
		return nil
	}
	return f
}

func partnerIDs(path string) []cobra.Completion {
	var out []cobra.Completion
	if f := loadForCompletion(path); f != nil {
		for _, p := range f.Partners {
			out = append(out, p.ID)
		}
	}
	return out
}

func feedNames(path string) []cobra.Completion {
	var out []cobra.Completion
	if f := loadForCompletion(path); f != nil {
		for _, p := range f.Partners {
			for _, fd := range p.Feeds {
				if !slices.Contains(out, fd.Name) {
					out = append(out, fd.Name)
				}
			}
		}
	}
	return out
}

// partnerFeeds are PARTNER/FEED pairs (expect ack).
func partnerFeeds(path string) []cobra.Completion {
	var out []cobra.Completion
	if f := loadForCompletion(path); f != nil {
		for _, p := range f.Partners {
			for _, fd := range p.Feeds {
				out = append(out, p.ID+"/"+fd.Name)
			}
		}
	}
	return out
}

// intakeIDs are the ids of the newest rows in states, each described by
// its partner, feed, file name and state; nothing when the config or the
// database does not answer within completeTimeout.
func intakeIDs(path string, states []string) []cobra.Completion {
	f := loadForCompletion(path)
	if f == nil {
		return nil
	}
	url, err := f.DatabaseURL()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
	defer cancel()
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil
	}
	cc.ConnectTimeout = completeTimeout
	cc.RuntimeParams["application_name"] = "intake completion"
	migrations.SetSearchPath(cc)
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT intake_id, partner_id, feed, remote_name, state FROM file_intake
		WHERE state = ANY($1) ORDER BY intake_id DESC LIMIT 200`, states)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []cobra.Completion
	for rows.Next() {
		var id int64
		var partner, feed, name, state string
		if rows.Scan(&id, &partner, &feed, &name, &state) != nil {
			return nil
		}
		out = append(out, cobra.CompletionWithDesc(strconv.FormatInt(id, 10), partner+"/"+feed+" "+name+" ("+state+")"))
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// completing: the arguments are a shell's completion request.
func completing(args []string) bool {
	return len(args) > 0 && (args[0] == cobra.ShellCompRequestCmd || args[0] == cobra.ShellCompNoDescRequestCmd)
}
