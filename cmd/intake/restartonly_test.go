package main

import (
	"slices"
	"testing"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/partners"
)

// The review console is built at the start: a reload that changes its
// settings (its reviewers), ops.four_eyes it asks, or the partners it
// shows is applied to the daemon and says the console follows at the next
// restart, not silently; without a console, ops rules are the CLI's, read
// from the file each time, and nothing is said.
func TestAReloadSaysTheConsoleFollowsAtTheNextRestart(t *testing.T) {
	base := func(withConsole bool) *config.File {
		f := &config.File{Partners: []partners.Config{{ID: "a", Poll: "@every 1m"}}}
		if withConsole {
			f.Console = console.Config{Listen: "127.0.0.1:8080", Auth: console.Auth{Reviewers: []string{"alice@example.com"}}}
		}
		return f
	}
	for _, c := range []struct {
		name    string
		console bool
		edit    func(*config.File)
		want    []string
	}{
		{"a reviewer removed", true, func(f *config.File) { f.Console.Auth.Reviewers = nil }, []string{"console"}},
		{"four eyes on", true, func(f *config.File) { f.Ops.FourEyes = true }, []string{"ops (on the console)"}},
		{"a partner added", true, func(f *config.File) { f.Partners = append(f.Partners, partners.Config{ID: "b", Poll: "@every 1m"}) },
			[]string{"console (partners)"}},
		{"a schedule changed", true, func(f *config.File) { f.Partners[0].Poll = "0 * * * *" }, []string{"console (partners)"}},
		{"four eyes on, no console", false, func(f *config.File) { f.Ops.FourEyes = true }, nil},
		{"a partner added, no console", false, func(f *config.File) { f.Partners = append(f.Partners, partners.Config{ID: "b"}) }, nil},
	} {
		cur, next := base(c.console), base(c.console)
		c.edit(next)
		if got := restartOnly(cur, next); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
