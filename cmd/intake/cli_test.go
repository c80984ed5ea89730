package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func runSplit(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// Every command's help, by -h and by `intake help`, lists each flag the
// command declares with its default (or that it is required) and an
// example, and exits 0.
func TestHelpListsEveryFlagWithItsDefaultAndAnExample(t *testing.T) {
	for _, c := range newRoot(io.Discard, io.Discard).Commands() {
		code, byFlag, _ := runSplit(c.Name(), "-h")
		if code != 0 {
			t.Fatalf("%s -h: exit %d", c.Name(), code)
		}
		code, byHelp, _ := runSplit("help", c.Name())
		if code != 0 || byHelp != byFlag {
			t.Fatalf("help %s: exit %d, and it differs from %s -h:\n%s\n---\n%s", c.Name(), code, c.Name(), byHelp, byFlag)
		}
		if !strings.Contains(byHelp, "Usage:\n  intake "+c.Name()) || !strings.Contains(byHelp, "Example:\n  "+c.Example) {
			t.Fatalf("help %s lacks the synopsis or the example:\n%s", c.Name(), byHelp)
		}
		for _, f := range commandFlags(c) {
			line := lineWith(byHelp, "  --"+f.Name+" ")
			if line == "" || !(strings.Contains(line, "(default: ") || strings.Contains(line, "(required")) {
				t.Fatalf("help %s: flag --%s without its default: %q\n%s", c.Name(), f.Name, line, byHelp)
			}
		}
	}
	if code, out, _ := runSplit("help", "run"); !strings.Contains(out, "--once         poll every partner once, then exit (default: false)") ||
		!strings.Contains(out, "--config FILE  config file (YAML), e.g. /etc/intake/intake.yaml (default: $INTAKE_CONFIG, else /etc/intake/intake.yaml)") || code != 0 {
		t.Fatalf("help run:\n%s", out)
	}
	if code, out, _ := runSplit("quarantine", "-h"); code != 0 || !strings.Contains(out, "(required by release and discard)") {
		t.Fatalf("quarantine -h: %d\n%s", code, out)
	}
	if code, out, _ := runSplit("help"); code != 0 || !strings.Contains(out, "completion") || !strings.Contains(out, "Exit codes") {
		t.Fatalf("help: %d\n%s", code, out)
	}
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

func TestEachMissingRequiredFlagIsNamed(t *testing.T) {
	cases := []struct {
		args    []string
		missing []string
	}{
		{[]string{"replay", "7"}, []string{"--reason TEXT is required"}},
		{[]string{"quarantine", "release", "7", "--config", "x.yaml"}, []string{"--reason TEXT is required", "--hold TOKEN is required"}},
		{[]string{"notify", "redeliver", "--config", "x.yaml", "--all"}, []string{"--reason TEXT is required"}},
		{[]string{"notify", "redeliver", "--config", "x.yaml", "--reason", "fixed"}, []string{"give --event ID or --all"}},
		{[]string{"notify", "redeliver", "--config", "x.yaml", "--reason", "fixed", "--all", "--event", "3"}, []string{"give --event ID or --all"}},
		{[]string{"check", "--partner", "x"}, nil}, // an unknown flag: the flag package names it
	}
	for _, c := range cases {
		code, _, errs := runSplit(c.args...)
		if code != 2 {
			t.Fatalf("%v: exit %d, want 2:\n%s", c.args, code, errs)
		}
		for _, m := range c.missing {
			if !strings.Contains(errs, m) {
				t.Fatalf("%v: stderr lacks %q:\n%s", c.args, m, errs)
			}
		}
		if len(c.missing) > 0 && !strings.Contains(errs, "e.g. intake "+c.args[0]) {
			t.Fatalf("%v: no example:\n%s", c.args, errs)
		}
	}
	// A long flag takes two dashes: one is refused, naming the spelling.
	if code, _, errs := runSplit("status", "-config", "x.yaml"); code != 2 || !strings.Contains(errs, "two dashes: --config") {
		t.Fatalf("status -config: exit %d, want 2 naming --config:\n%s", code, errs)
	}
	// Flags may come before the intake id.
	if code, _, errs := runSplit("quarantine", "release", "--config", "x.yaml", "7"); code != 2 || !strings.Contains(errs, "intake quarantine release: --reason TEXT is required") {
		t.Fatalf("quarantine release --config x.yaml 7: exit %d\n%s", code, errs)
	}
	// quarantine list needs no --reason
	if _, _, errs := runSplit("quarantine", "list", "--config", "/nonexistent.yaml"); strings.Contains(errs, "--reason") {
		t.Fatalf("quarantine list asked for --reason:\n%s", errs)
	}
}

// One exit-code table for every command: 0 ok, 1 needs attention, 2 usage
// or config error (here without a database: the cases that need one are in
// main_test.go and ops_test.go).
func TestExitCodesAreTheSameForEveryCommand(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("worker_id: x\nnot_a_key: 1\n"), 0o600)
	missing := filepath.Join(dir, "missing.yaml")
	cases := []struct {
		args []string
		code int
	}{
		{[]string{"help"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"version"}, 0},
		{[]string{"completion", "bash"}, 0},
		{[]string{"run", "-h"}, 0},
		{[]string{}, 2},
		{[]string{"frobnicate"}, 2},
		{[]string{"help", "frobnicate"}, 2},
		{[]string{"completion", "tcsh"}, 2},
		{[]string{"man", "extra"}, 2},
		{[]string{"run", "--nope"}, 2},
	}
	for _, cmd := range []string{"check", "run", "reconcile", "status", "purge", "audit"} {
		cases = append(cases, struct {
			args []string
			code int
		}{[]string{cmd, "--config", bad}, 2}, struct {
			args []string
			code int
		}{[]string{cmd, "--config", missing}, 2})
	}
	for _, c := range cases {
		if code, out, errs := runSplit(c.args...); code != c.code {
			t.Errorf("intake %s: exit %d, want %d\n%s%s", strings.Join(c.args, " "), code, c.code, out, errs)
		}
	}
}

// The bash script completes commands, sub-commands, flags and flag values
// when bash runs it; the zsh script parses and registers itself.
func TestCompletionScripts(t *testing.T) {
	code, script, errs := runSplit("completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: %d %s", code, errs)
	}
	path := filepath.Join(t.TempDir(), "intake.bash")
	os.WriteFile(path, []byte(script), 0o600)
	bin := cliOnPath(t)
	complete := func(words ...string) string {
		t.Helper()
		// _get_comp_words_by_ref stands in for the bash-completion
		// package's, which loads the installed script on a host;
		// compopt works only under a real completion.
		sh := `_get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }; compopt() { :; }
		source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; __start_intake; echo "${COMPREPLY[*]}"`
		cmd := exec.Command("bash", append([]string{"-c", sh, "bash", path}, words...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"intake", "ru"}, "run"},
		{[]string{"intake", "--log-level", "debug", "qu"}, "quarantine"},
		{[]string{"intake", "quarantine", "re"}, "release"},
		{[]string{"intake", "quarantine", "release", "--re"}, "--reason"},
		{[]string{"intake", "run", "--o"}, "--once"},
		{[]string{"intake", "--log-level", "w"}, "warn"},
		{[]string{"intake", "quarantine", "release", "1", "--winner", ""}, "new old"},
		{[]string{"intake", "completion", ""}, "bash zsh fish"},
		{[]string{"intake", "help", "rep"}, "replay"},
	} {
		if got := complete(c.words...); got != c.want {
			t.Errorf("completing %q: got %q, want %q", c.words, got, c.want)
		}
	}

	code, script, errs = runSplit("completion", "zsh")
	if code != 0 || !strings.HasPrefix(script, "#compdef intake\n") {
		t.Fatalf("completion zsh: %d %s", code, errs)
	}
	if !strings.Contains(script, "__complete") {
		t.Fatal("the zsh script does not ask intake __complete")
	}
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Log("zsh not installed: its script is checked by content only")
		return
	}
	zpath := filepath.Join(t.TempDir(), "_intake")
	os.WriteFile(zpath, []byte(script), 0o600)
	if out, err := exec.Command(zsh, "-n", zpath).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	out, err := exec.Command(zsh, "-f", "-c", `autoload -U compinit && compinit -u -D && source "$1" && print -r -- $_comps[intake]`, "zsh", zpath).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "_intake" {
		t.Fatalf("zsh did not register _intake for intake: %v %q", err, out)
	}
}

// Without --config a command reads $INTAKE_CONFIG, else
// /etc/intake/intake.yaml; --config wins over both.
func TestConfigPathDefaultsToEnvThenPackagedPath(t *testing.T) {
	dir := t.TempDir()
	fromEnv := filepath.Join(dir, "from-env.yaml")
	fromFlag := filepath.Join(dir, "from-flag.yaml")
	for _, p := range []string{fromEnv, fromFlag} {
		if err := os.WriteFile(p, []byte("worker_id: x\nnot_a_key: 1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("INTAKE_CONFIG", fromEnv)
	if code, _, errs := runSplit("status"); code != 2 || !strings.Contains(errs, fromEnv) {
		t.Fatalf("status with INTAKE_CONFIG: exit %d, want 2 naming %s:\n%s", code, fromEnv, errs)
	}
	if code, _, errs := runSplit("status", "--config", fromFlag); code != 2 || !strings.Contains(errs, fromFlag) || strings.Contains(errs, fromEnv) {
		t.Fatalf("status --config with INTAKE_CONFIG: exit %d, want 2 naming %s only:\n%s", code, fromFlag, errs)
	}
	t.Setenv("INTAKE_CONFIG", "")
	if _, _, errs := runSplit("status"); !strings.Contains(errs, "/etc/intake/intake.yaml") {
		t.Fatalf("status without --config or INTAKE_CONFIG does not read /etc/intake/intake.yaml:\n%s", errs)
	}
}

// intake(1), rendered by groff with every warning on, has a section for
// each command of the registry with each of its flags; the fish script,
// loaded by a real fish, completes every command and their sub-commands,
// flags and flag values. The hidden man command is in neither, nor in the
// usage text.
func TestManPageAndFishCompletionCoverEveryCommand(t *testing.T) {
	code, page, errs := runSplit("man")
	if code != 0 || !strings.HasPrefix(page, `.\" intake(1)`) {
		t.Fatalf("intake man: %d %s\n%.200s", code, errs, page)
	}
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Fatal("groff not installed (make deps installs groff-base): the man page cannot be rendered")
	}
	cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-rLL=200n", "-P-cbou")
	cmd.Stdin = strings.NewReader(page)
	var rendered, warnings bytes.Buffer
	cmd.Stdout, cmd.Stderr = &rendered, &warnings
	if err := cmd.Run(); err != nil || warnings.Len() > 0 {
		t.Fatalf("groff -man -ww: %v\n%s", err, warnings.String())
	}
	// groff's utf8 device renders a hyphen as U+2010 and a minus as U+2212;
	// \- in the page is a minus, which copies as "-" in a terminal.
	text := strings.NewReplacer("\u2212", "-", "\u2010", "-").Replace(rendered.String())
	tree := newRoot(io.Discard, io.Discard)
	for _, c := range visibleCommands(tree) {
		head := lineWith(text, "   intake "+c.Name())
		if head == "" || !strings.HasPrefix(strings.TrimSpace(head), strings.TrimSpace("intake "+c.Name()+" "+synopsis(c))) {
			t.Errorf("man page: no section for intake %s (%q)", c.Name(), head)
		}
		for _, f := range commandFlags(c) {
			if !strings.Contains(text, "--"+f.Name) {
				t.Errorf("man page: intake %s: no --%s", c.Name(), f.Name)
			}
		}
		if !strings.Contains(text, c.Example) {
			t.Errorf("man page: intake %s: no example %q", c.Name(), c.Example)
		}
	}
	// The page is built once and installed everywhere: no default may be
	// the builder's (--actor defaults to the login name of who runs it).
	if u := defaultActor(); u != "" && strings.Contains(text, "(default: "+u+")") {
		t.Errorf("the man page carries the builder's login name %q as a default", u)
	}
	for _, want := range []string{"EXIT STATUS", "INTAKE_CONFIG", "INTAKE_DATABASE_URL", "/etc/intake/intake.yaml", "(default: the login name)"} {
		if !strings.Contains(text, want) {
			t.Errorf("man page lacks %q", want)
		}
	}
	if strings.Contains(text, "intake man") {
		t.Error("the man page lists the hidden man command")
	}
	if _, out, _ := runSplit("help"); strings.Contains(out, "\n  man ") {
		t.Errorf("the usage text lists the hidden man command:\n%s", out)
	}

	code, script, errs := runSplit("completion", "fish")
	if code != 0 {
		t.Fatalf("completion fish: %d %s", code, errs)
	}
	fish, err := exec.LookPath("fish")
	if err != nil {
		t.Fatal("fish not installed (make deps installs it): the fish script cannot be loaded")
	}
	bin := cliOnPath(t)
	path := filepath.Join(t.TempDir(), "intake.fish")
	os.WriteFile(path, []byte(script), 0o600)
	if out, err := exec.Command(fish, "--no-config", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("fish -n: %v\n%s", err, out)
	}
	complete := func(line string) string {
		t.Helper()
		cmd := exec.Command(fish, "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, path, line)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fish: %v\n%s", err, out)
		}
		var words []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			words = append(words, strings.SplitN(l, "\t", 2)[0])
		}
		return strings.Join(words, " ")
	}
	if got, want := complete("intake "), strings.Join(commandNames(tree), " "); got != want {
		t.Errorf("fish completes %q as %q, want every command: %q", "intake ", got, want)
	}
	for _, c := range []struct{ line, want string }{
		{"intake ru", "run"},
		{"intake --log-level debug qu", "quarantine"},
		{"intake quarantine re", "release"},
		{"intake quarantine release --re", "--reason"},
		{"intake run --o", "--once"},
		{"intake --log-level w", "warn"},
		{"intake quarantine release 1 --winner ", "new old"},
		{"intake completion ", "bash fish zsh"},
		{"intake help rep", "replay"},
	} {
		if got := complete(c.line); got != c.want {
			t.Errorf("fish completes %q as %q, want %q", c.line, got, c.want)
		}
	}
	for _, c := range visibleCommands(tree) {
		for _, f := range commandFlags(c) {
			if got := complete("intake " + c.Name() + " --" + f.Name); !slices.Contains(strings.Fields(got), "--"+f.Name) {
				t.Errorf("fish does not complete intake %s --%s: %q", c.Name(), f.Name, got)
			}
		}
	}
}

// asCLIEnv makes the test binary run as intake (TestMain).
const asCLIEnv = "INTAKE_TEST_AS_CLI"

// cliOnPath is a directory holding an "intake" that runs this test binary
// as intake: the completion scripts call intake __complete.
func cliOnPath(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sh := "#!/bin/sh\n" + asCLIEnv + "=1 exec '" + exe + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "intake"), []byte(sh), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
