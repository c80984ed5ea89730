package intake

import (
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

// What a reload must find finished before it retires a partner's runtime:
// a removal, this worker's rows and (unless settled) its own processing
// dir, never another worker's, which other replicas still serving the
// partner look after; a moved processing dir, every worker's rows below
// it and every worker's dir there; a moved quarantine or archive dir,
// every live row, whichever worker holds it (any of them may be a hold or
// an archive whose end is not recorded, and this daemon's reconciler may
// take it over; a file awaiting approval has no move half done); a change
// elsewhere, nothing.
func TestReloadScopes(t *testing.T) {
	cur := &partners.Config{ID: "p", SFTP: partners.SFTP{Address: "sftp.example:22", User: "u", Root: "/in"},
		Dirs: partners.Dirs{Processing: "processing", Quarantine: "quarantine", Archive: "archive", Reports: "reports"}}
	edit := func(f func(*partners.Config)) *partners.Config {
		c := *cur
		f(&c)
		return &c
	}
	for _, c := range []struct {
		name string
		next *partners.Config
		want leftScope
		ok   bool
	}{
		{"removed", nil, leftScope{why: "removes the partner", worker: "w1", list: "/in/processing/w1", unlessSettled: true}, true},
		{"processing moved", edit(func(c *partners.Config) { c.Dirs.Processing = "work" }),
			leftScope{why: "moves the partner's processing dir", under: "/in/processing", list: "/in/processing", base: true}, true},
		{"quarantine moved", edit(func(c *partners.Config) { c.Dirs.Quarantine = "held" }),
			leftScope{why: "moves the partner's quarantine or archive dir", live: true}, true},
		{"archive moved", edit(func(c *partners.Config) { c.Dirs.Archive = "done" }),
			leftScope{why: "moves the partner's quarantine or archive dir", live: true}, true},
		{"root moved", edit(func(c *partners.Config) { c.SFTP.Root = "/in2" }),
			leftScope{why: "moves the partner's processing dir and its quarantine or archive dir", list: "/in/processing", base: true}, true},
		{"reports moved", edit(func(c *partners.Config) { c.Dirs.Reports = "receipts" }), leftScope{}, false},
		{"poll changed", edit(func(c *partners.Config) { c.Poll = "@every 1m" }), leftScope{}, false},
	} {
		got, ok := scopeOf(cur, c.next, "w1")
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %+v %v, want %+v %v", c.name, got, ok, c.want, c.ok)
		}
	}
	rec := edit(func(c *partners.Config) { c.Claim = partners.ClaimRecord })
	if got, _ := scopeOf(rec, nil, "w1"); got != (leftScope{why: "removes the partner", worker: "w1"}) {
		t.Errorf("a claim: record partner removed: %+v, want its rows of w1 alone (it has no processing dir)", got)
	}
}
