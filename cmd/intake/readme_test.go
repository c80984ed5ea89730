package main

import (
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
