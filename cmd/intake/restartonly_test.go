package main

import (
	"slices"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/partners"
)

// What a reload does not apply is said; the review console follows its
// reviewers, ops.four_eyes and the partners (consoleScope), and only its
// listener and sign-in wait for a restart.
func TestAReloadSaysWhatWaitsForTheNextRestart(t *testing.T) {
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
		{"a reviewer removed", true, func(f *config.File) { f.Console.Auth.Reviewers = nil }, nil},
		{"a viewer added", true, func(f *config.File) { f.Console.Auth.Viewers = []string{"victor@example.com"} }, nil},
		{"four eyes on", true, func(f *config.File) { f.Ops.FourEyes = true }, nil},
		{"a partner added", true, func(f *config.File) { f.Partners = append(f.Partners, partners.Config{ID: "b", Poll: "@every 1m"}) }, nil},
		{"a schedule changed", true, func(f *config.File) { f.Partners[0].Poll = "0 * * * *" }, nil},
		{"the console's listener", true, func(f *config.File) { f.Console.Listen = "127.0.0.1:8081" }, []string{"console"}},
		{"the console's sign-in", true, func(f *config.File) { f.Console.Auth.Proxy = &console.Proxy{Header: "X-User"} }, []string{"console"}},
		{"the lease", false, func(f *config.File) { f.Lease = time.Minute }, []string{"lease"}},
	} {
		cur, next := base(c.console), base(c.console)
		c.edit(next)
		if got := restartOnly(cur, next); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
