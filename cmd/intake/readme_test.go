package main

import (
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README names the Go version go.mod requires: with GOTOOLCHAIN=local
// an older Go fails at the first command.
func TestReadmeNamesTheGoVersionOfGoMod(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "Go " + string(m[1]) + " or later"; !strings.Contains(string(readme), want) {
		t.Fatalf("README.md does not say %q", want)
	}
}

// The README's commands table lists every command of the tree, each with
// its one-line description as `intake --help` prints it.
func TestReadmeListsEveryCommand(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z]+)` \\| (.*) \\|$").FindAllStringSubmatch(string(readme), -1) {
		rows[m[1]] = strings.ReplaceAll(m[2], `\|`, "|")
	}
	root := newRoot(io.Discard, io.Discard)
	n := 0
	for _, c := range root.Commands() {
		if c.Hidden {
			continue
		}
		n++
		if got, ok := rows[c.Name()]; !ok {
			t.Errorf("README.md's commands table lacks %s", c.Name())
		} else if got != c.Short {
			t.Errorf("README.md says %s %q, the command says %q", c.Name(), got, c.Short)
		}
	}
	if len(rows) != n {
		t.Errorf("README.md's commands table has %d rows, the tree %d commands", len(rows), n)
	}
}
