package partners

import "testing"

// What a config change moves: a partner's processing dir moves with its
// site, login or root, dirs.processing, and when it starts recording
// claims (claim: record has none); its quarantine and archive dirs with
// its site, login or root, dirs.quarantine or dirs.archive, and claim:
// record (it moves no file). A change of the host's case, or a dir
// spelled with a trailing slash, moves nothing; from claim: record there
// is nothing to move.
func TestWhatAConfigChangeMoves(t *testing.T) {
	base := Config{SFTP: SFTP{Address: "sftp.example:22", User: "acme", Root: "/in"},
		Dirs: Dirs{Processing: "processing", Quarantine: "quarantine", Archive: "archive", Reports: "reports"}}
	for _, c := range []struct {
		name               string
		edit               func(*Config)
		processing, finish bool
	}{
		{"nothing", func(*Config) {}, false, false},
		{"the host's case", func(c *Config) { c.SFTP.Address = "SFTP.example:22" }, false, false},
		{"a root spelled otherwise", func(c *Config) { c.SFTP.Root = "/in/" }, false, false},
		{"a quarantine dir spelled otherwise", func(c *Config) { c.Dirs.Quarantine = "quarantine/" }, false, false},
		{"another reports dir", func(c *Config) { c.Dirs.Reports = "receipts" }, false, false},
		{"another processing dir", func(c *Config) { c.Dirs.Processing = "work" }, true, false},
		{"another quarantine dir", func(c *Config) { c.Dirs.Quarantine = "held" }, false, true},
		{"another archive dir", func(c *Config) { c.Dirs.Archive = "done" }, false, true},
		{"another site", func(c *Config) { c.SFTP.Address = "other.example:22" }, true, true},
		{"another login", func(c *Config) { c.SFTP.User = "acme2" }, true, true},
		{"another root", func(c *Config) { c.SFTP.Root = "/in2" }, true, true},
		{"claim: record", func(c *Config) { c.Claim = ClaimRecord }, true, true},
	} {
		next := base
		c.edit(&next)
		if got := base.ProcessingMoves(&next); got != c.processing {
			t.Errorf("%s: processing dir moves %v, want %v", c.name, got, c.processing)
		}
		if got := base.FinishDirsMove(&next); got != c.finish {
			t.Errorf("%s: quarantine or archive dir moves %v, want %v", c.name, got, c.finish)
		}
	}
	rec := base
	rec.Claim = ClaimRecord
	if next := base; rec.ProcessingMoves(&next) || rec.FinishDirsMove(&next) {
		t.Error("from claim: record: no dir to move, no file ever moved there")
	}
}
