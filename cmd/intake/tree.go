package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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
// constructor (its Use, Short, Example and flags beside its function):
// cobra parses each command's flags (checkFlags names a missing required
// one; flagError answers one it cannot parse), prints its help
// (helpTemplate), answers the shells' __complete requests, generates the
// completion scripts and suggests a command for a mistyped one; the man
// page walks the same tree.
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:                        "intake",
		Short:                      "partner files from SFTP into PostgreSQL, exactly once in effect",
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE:          checkFlags,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetHelpTemplate(helpTemplate)
	root.SetFlagErrorFunc(flagError)
	// The global flags, for the completion of their values: run takes
	// them out of the arguments before cobra sees them (parseGlobal).
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().String("log-format", "", "log format: json or text")
	root.RegisterFlagCompletionFunc("log-level", fixedValues("debug", "info", "warn", "error"))
	root.RegisterFlagCompletionFunc("log-format", fixedValues("json", "text"))
	for _, build := range commands {
		cc := build()
		root.AddCommand(cc)
		completions(cc)
	}
	help := helpCommand()
	help.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return withPrefix(commandNames(cmd.Root()), toComplete), cobra.ShellCompDirectiveNoFileComp
	}
	root.SetHelpCommand(help)
	root.InitDefaultHelpCmd()
	return root
}

// The tree keeps the registry's order: the man page walks it.
func init() { cobra.EnableCommandSorting = false }

// execute runs args (after the global flags) through the tree.
func execute(root *cobra.Command, args []string) int {
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return int(ee)
	default:
		fmt.Fprintf(root.ErrOrStderr(), "intake: %v\n", err)
		return 2
	}
}

// suggest is cobra's "did you mean" for a mistyped command, or "".
func suggest(root *cobra.Command, name string) string {
	s := root.SuggestionsFor(name)
	if len(s) == 0 {
		return ""
	}
	return "did you mean " + strings.Join(s, " or ") + "?\n"
}

// completionCommand is `intake completion`.
func completionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:         "completion bash|zsh|fish",
		Short:       "print the shell completion script",
		Example:     "source <(intake completion bash)",
		Annotations: map[string]string{annSubs: "bash zsh fish"},
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return exitErr(cmdCompletion(cmd.Root(), args, cmd.OutOrStdout(), cmd.ErrOrStderr()))
	}
	return cmd
}

// exitErr is an exit code as RunE returns it.
func exitErr(code int) error {
	if code != 0 {
		return exitError(code)
	}
	return nil
}

// cmdCompletion prints cobra's completion script for bash, zsh or fish;
// the script asks `intake __complete` for each word, so it never lags
// behind the commands and their flags, and completes partner ids, feed
// names and intake ids (completions).
func cmdCompletion(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "intake completion: give the shell: bash, zsh or fish (e.g. source <(intake completion bash))")
		return 2
	}
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
	return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return withPrefix(vs, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// withPrefix are the candidates that start with what is typed.
func withPrefix(cs []cobra.Completion, toComplete string) []cobra.Completion {
	var out []cobra.Completion
	for _, c := range cs {
		if strings.HasPrefix(c, toComplete) {
			out = append(out, c)
		}
	}
	return out
}

// completeTimeout bounds what completion may wait for the config and the
// database: a shell waits for it.
const completeTimeout = 2 * time.Second

// idStates are the states of the rows a command taking an intake id
// acts on, by command and sub-command.
var idStates = map[string][]string{
	"quarantine release": {"quarantined", "failed_terminal"},
	"quarantine discard": {"quarantined", "failed_terminal"},
	"quarantine show":    {"quarantined", "failed_terminal", "discarded"},
	"approve":            {"awaiting_approval"},
	"reject":             {"awaiting_approval"},
	"plan show":          {"awaiting_approval", "applied", "archived", "quarantined"},
	"replay":             {"archived", "applied"},
}

// completions registers how a command's words complete (cobra completes
// its flags' names): --config a YAML file, --partner a partner id of the
// config, --winner new or old, its sub-commands and the intake id a
// command takes (from the database), expect ack's PARTNER/FEED. Whatever
// cannot be read in time completes to nothing.
func completions(cmd *cobra.Command) {
	fs := cmd.Flags()
	if fs.Lookup("config") != nil {
		cmd.MarkFlagFilename("config", "yaml", "yml")
	}
	if fs.Lookup("partner") != nil {
		cmd.RegisterFlagCompletionFunc("partner", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return withPrefix(partnerIDs(configOf(cmd)), toComplete), cobra.ShellCompDirectiveNoFileComp
		})
	}
	if fs.Lookup("winner") != nil {
		cmd.RegisterFlagCompletionFunc("winner", fixedValues("new", "old"))
	}
	cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return withPrefix(completeArgs(cmd, args), toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// configOf is the --config given on the line being completed, or "".
func configOf(cmd *cobra.Command) string {
	p, _ := cmd.Flags().GetString("config")
	return p
}

// completeArgs are the candidates for the next argument of cmd after args.
func completeArgs(cmd *cobra.Command, args []string) []cobra.Completion {
	key := cmd.Name()
	if subs := subsOf(cmd); len(subs) > 0 {
		if len(args) == 0 {
			return subs
		}
		key += " " + args[0]
		args = args[1:]
	}
	if len(args) > 0 {
		return nil
	}
	if st, ok := idStates[key]; ok {
		return intakeIDs(configOf(cmd), st)
	}
	if key == "expect ack" {
		return partnerFeeds(configOf(cmd))
	}
	return nil
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
