package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// cmdCompletion prints a completion script for bash, zsh or fish, generated
// from the command registry and each command's own flag set, so it never
// lags behind the flags.
func cmdCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "intake completion: give the shell: bash, zsh or fish (e.g. source <(intake completion bash))")
		return 2
	}
	switch args[0] {
	case "bash":
		fmt.Fprint(stdout, bashCompletion())
	case "zsh":
		fmt.Fprint(stdout, zshCompletion())
	case "fish":
		fmt.Fprint(stdout, fishCompletion())
	default:
		fmt.Fprintf(stderr, "intake completion: %q: only bash, zsh and fish\n", args[0])
		return 2
	}
	return 0
}

// flagList is a command's flags in order of name.
func flagList(c *command) []*flag.Flag {
	var fl []*flag.Flag
	if fs := flagsOf(c); fs != nil {
		fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	}
	return fl
}

// flagValues are the values a flag takes, where they are a fixed set.
var flagValues = map[string]string{"log-level": "debug info warn error", "log-format": "json text", "winner": "new old"}

func bashCompletion() string {
	var b strings.Builder
	valueFlags := map[string]bool{"--log-level": true, "--log-format": true}
	var cases strings.Builder
	for _, c := range visibleCommands() {
		var words []string
		for _, f := range flagList(c) {
			words = append(words, "--"+f.Name)
			if !isBool(f) {
				valueFlags["--"+f.Name] = true
			}
		}
		first := c.subs
		if c.name == "help" {
			first = commandNames()
		}
		if len(first) > 0 {
			fmt.Fprintf(&cases, "\t%s)\n\t\tif [[ -z $sub ]]; then words=%q; else words=%q; fi ;;\n",
				c.name, strings.Join(first, " "), strings.Join(words, " "))
		} else {
			fmt.Fprintf(&cases, "\t%s) words=%q ;;\n", c.name, strings.Join(words, " "))
		}
	}
	vf := sortedKeys(valueFlags)
	fmt.Fprintf(&b, `# bash completion for intake. Load it with: source <(intake completion bash)
# or save it as /etc/bash_completion.d/intake.
_intake() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
	local cmd= sub= words= i w
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		case $w in
		%s) ((i++)) ;;
		-*) ;;
		*) if [[ -z $cmd ]]; then cmd=$w; elif [[ -z $sub ]]; then sub=$w; fi ;;
		esac
	done
	case $prev in
	--config) COMPREPLY=($(compgen -f -- "$cur")); return ;;
`, strings.Join(vf, "|"))
	for _, name := range sortedKeys(flagValues) {
		fmt.Fprintf(&b, "\t--%s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", name, flagValues[name])
	}
	fmt.Fprintf(&b, "\t%s) return ;;\n\tesac\n\tcase $cmd in\n\t\"\") words=%q ;;\n%s\tesac\n",
		strings.Join(vf, "|"), strings.Join(commandNames(), " ")+" --version --help", cases.String())
	b.WriteString(`	if [[ $cur == -* ]]; then words="$words --log-level --log-format"; fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -F _intake intake
`)
	return b.String()
}

func zshCompletion() string {
	var b strings.Builder
	b.WriteString(`#compdef intake
# zsh completion for intake. Load it with: source <(intake completion zsh)
# or save it as _intake in a directory of $fpath.
_intake() {
	local -a commands global
	commands=(
`)
	for _, c := range visibleCommands() {
		fmt.Fprintf(&b, "\t\t%s\n", zshQuote(c.name+":"+c.summary))
	}
	b.WriteString(`	)
	global=(
		'--log-level=[log level]:level:(debug info warn error)'
		'--log-format=[log format]:format:(json text)'
	)
	local curcontext=$curcontext state line
	typeset -A opt_args
	_arguments -C $global '--version[print version, commit and Go version]' '1:command:->command' '*::argument:->argument' && return
	case $state in
	command) _describe -t commands 'intake command' commands ;;
	argument)
		case $line[1] in
`)
	for _, c := range visibleCommands() {
		specs := []string{"$global"}
		switch {
		case c.name == "help":
			specs = append(specs, zshQuote("1:command:("+strings.Join(commandNames(), " ")+")"))
		case len(c.subs) > 0:
			specs = append(specs, zshQuote("1:subcommand:("+strings.Join(c.subs, " ")+")"))
		}
		for _, f := range flagList(c) {
			_, use := flag.UnquoteUsage(f)
			desc := zshEscape(use)
			switch {
			case isBool(f):
				specs = append(specs, zshQuote("--"+f.Name+"["+desc+"]"))
			case f.Name == "config":
				specs = append(specs, zshQuote("--"+f.Name+"=["+desc+"]:file:_files"))
			case flagValues[f.Name] != "":
				specs = append(specs, zshQuote("--"+f.Name+"=["+desc+"]:"+f.Name+":("+flagValues[f.Name]+")"))
			default:
				specs = append(specs, zshQuote("--"+f.Name+"=["+desc+"]:"+strings.ToLower(argName(f))+":"))
			}
		}
		if c.name == "replay" || len(c.subs) > 0 && c.name == "quarantine" {
			specs = append(specs, zshQuote("*:intake id:"))
		}
		fmt.Fprintf(&b, "\t\t%s) _arguments %s ;;\n", c.name, strings.Join(specs, " "))
	}
	b.WriteString(`		esac ;;
	esac
}
if [[ $funcstack[1] == _intake ]]; then
	_intake "$@"
else
	compdef _intake intake
fi
`)
	return b.String()
}

// zshEscape makes text safe inside an _arguments description.
func zshEscape(s string) string {
	return strings.NewReplacer("[", `\[`, "]", `\]`).Replace(s)
}

// zshQuote single-quotes s for zsh.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// fishCompletion is the fish script: fish reads completions as `complete`
// commands, one per word, each with the condition under which it applies.
// __intake_words is the command line's words before the cursor that are
// neither flags nor flag values (the command, then its sub-command).
func fishCompletion() string {
	var b strings.Builder
	valueFlags := map[string]bool{"--log-level": true, "--log-format": true}
	for _, c := range visibleCommands() {
		for _, f := range flagList(c) {
			if !isBool(f) {
				valueFlags["--"+f.Name] = true
			}
		}
	}
	fmt.Fprintf(&b, `# fish completion for intake. Load it with: intake completion fish | source
# or save it as ~/.config/fish/completions/intake.fish.
function __intake_words
	set -l words (commandline -opc)
	set -e words[1]
	set -l skip 0
	for w in $words
		if test $skip = 1
			set skip 0
			continue
		end
		switch $w
			case %s
				set skip 1
			case '-*'
			case '*'
				echo $w
		end
	end
end
function __intake_needs_command
	test (count (__intake_words)) -eq 0
end
function __intake_using
	set -l w (__intake_words)
	test (count $w) -ge 1; and test "$w[1]" = $argv[1]
end
function __intake_needs_sub
	set -l w (__intake_words)
	test (count $w) -eq 1; and test "$w[1]" = $argv[1]
end
complete -c intake -f
complete -c intake -l log-level -x -a %s -d 'log level'
complete -c intake -l log-format -x -a %s -d 'log format'
complete -c intake -n __intake_needs_command -l version -d 'print version, commit and Go version'
`, strings.Join(sortedKeys(valueFlags), " "), fishQuote(flagValues["log-level"]), fishQuote(flagValues["log-format"]))
	for _, c := range visibleCommands() {
		fmt.Fprintf(&b, "complete -c intake -n __intake_needs_command -a %s -d %s\n", c.name, fishQuote(c.summary))
	}
	for _, c := range visibleCommands() {
		cond := fishQuote("__intake_using " + c.name)
		switch {
		case c.name == "help":
			fmt.Fprintf(&b, "complete -c intake -n %s -a %s\n", fishQuote("__intake_needs_sub help"), fishQuote(strings.Join(commandNames(), " ")))
		case len(c.subs) > 0:
			fmt.Fprintf(&b, "complete -c intake -n %s -a %s\n", fishQuote("__intake_needs_sub "+c.name), fishQuote(strings.Join(c.subs, " ")))
		}
		for _, f := range flagList(c) {
			_, use := flag.UnquoteUsage(f)
			line := fmt.Sprintf("complete -c intake -n %s -l %s", cond, f.Name)
			switch {
			case isBool(f):
			case f.Name == "config":
				line += " -r -F"
			case flagValues[f.Name] != "":
				line += " -x -a " + fishQuote(flagValues[f.Name])
			default:
				line += " -x"
			}
			fmt.Fprintf(&b, "%s -d %s\n", line, fishQuote(use))
		}
	}
	return b.String()
}

// fishQuote single-quotes s for fish (backslash and quote escaped).
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(s) + "'"
}
