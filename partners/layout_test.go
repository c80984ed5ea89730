package partners

import "testing"

// A partner's processing dir moves with its site, login, root or
// dirs.processing, and when it starts recording claims (claim: record has
// none to move from); a change elsewhere, or in the case of the host, does
// not move it.
func TestProcessingMoves(t *testing.T) {
	base := Config{SFTP: SFTP{Address: "sftp.example:22", User: "acme", Root: "/in"}, Dirs: Dirs{Processing: "processing"}}
	for _, c := range []struct {
		name  string
		edit  func(*Config)
		moves bool
	}{
		{"nothing", func(*Config) {}, false},
		{"the host's case", func(c *Config) { c.SFTP.Address = "SFTP.example:22" }, false},
		{"a root spelled otherwise", func(c *Config) { c.SFTP.Root = "/in/" }, false},
		{"another site", func(c *Config) { c.SFTP.Address = "other.example:22" }, true},
		{"another login", func(c *Config) { c.SFTP.User = "acme2" }, true},
		{"another root", func(c *Config) { c.SFTP.Root = "/in2" }, true},
		{"another processing dir", func(c *Config) { c.Dirs.Processing = "work" }, true},
		{"claim: record", func(c *Config) { c.Claim = ClaimRecord }, true},
	} {
		next := base
		c.edit(&next)
		if got := base.ProcessingMoves(&next); got != c.moves {
			t.Errorf("%s: moves %v, want %v", c.name, got, c.moves)
		}
	}
	rec := base
	rec.Claim = ClaimRecord
	if next := base; rec.ProcessingMoves(&next) {
		t.Error("from claim: record: there is no processing dir to move")
	}
}
