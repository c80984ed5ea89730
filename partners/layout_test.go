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

// A partner's quarantine and archive dirs move with its site, login or
// root, dirs.quarantine or dirs.archive, and when it starts recording
// claims (claim: record moves no file); a change of its processing or
// reports dir, or of the host's case, does not move them.
func TestFinishDirsMove(t *testing.T) {
	base := Config{SFTP: SFTP{Address: "sftp.example:22", User: "acme", Root: "/in"},
		Dirs: Dirs{Processing: "processing", Quarantine: "quarantine", Archive: "archive", Reports: "reports"}}
	for _, c := range []struct {
		name  string
		edit  func(*Config)
		moves bool
	}{
		{"nothing", func(*Config) {}, false},
		{"the host's case", func(c *Config) { c.SFTP.Address = "SFTP.example:22" }, false},
		{"a quarantine dir spelled otherwise", func(c *Config) { c.Dirs.Quarantine = "quarantine/" }, false},
		{"another processing dir", func(c *Config) { c.Dirs.Processing = "work" }, false},
		{"another reports dir", func(c *Config) { c.Dirs.Reports = "receipts" }, false},
		{"another site", func(c *Config) { c.SFTP.Address = "other.example:22" }, true},
		{"another login", func(c *Config) { c.SFTP.User = "acme2" }, true},
		{"another root", func(c *Config) { c.SFTP.Root = "/in2" }, true},
		{"another quarantine dir", func(c *Config) { c.Dirs.Quarantine = "held" }, true},
		{"another archive dir", func(c *Config) { c.Dirs.Archive = "done" }, true},
		{"claim: record", func(c *Config) { c.Claim = ClaimRecord }, true},
	} {
		next := base
		c.edit(&next)
		if got := base.FinishDirsMove(&next); got != c.moves {
			t.Errorf("%s: moves %v, want %v", c.name, got, c.moves)
		}
	}
	rec := base
	rec.Claim = ClaimRecord
	if next := base; rec.FinishDirsMove(&next) {
		t.Error("from claim: record: no file was ever moved there")
	}
}
