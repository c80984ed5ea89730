package partners

import (
	"fmt"
	"path"
	"strings"
	"time"
)

// Layout turns the partner's directory names into remote paths.
type Layout struct {
	Root string
	Dirs Dirs
}

// NewLayout returns the layout of p.
func NewLayout(p *Config) Layout { return Layout{Root: p.SFTP.Root, Dirs: p.Dirs} }

func (l Layout) join(parts ...string) string {
	return path.Join(append([]string{l.Root}, parts...)...)
}

// Ready is ready/<name>.
func (l Layout) Ready(name string) string { return l.join(l.Dirs.Ready, name) }

// ReadyDir is ready/.
func (l Layout) ReadyDir() string { return l.join(l.Dirs.Ready) }

// IncomingDir is incoming/.
func (l Layout) IncomingDir() string { return l.join(l.Dirs.Incoming) }

// ProcessingDir is processing/<worker>/.
func (l Layout) ProcessingDir(worker string) string { return l.join(l.Dirs.Processing, worker) }

// ProcessingBase is processing/, the parent of every worker's dir.
func (l Layout) ProcessingBase() string { return l.join(l.Dirs.Processing) }

// Processing is processing/<worker>/<name>.
func (l Layout) Processing(worker, name string) string {
	return l.join(l.Dirs.Processing, worker, name)
}

// ArchiveDir is archive/YYYY/MM/ for t (UTC).
func (l Layout) ArchiveDir(t time.Time) string {
	t = t.UTC()
	return l.join(l.Dirs.Archive, fmt.Sprintf("%04d", t.Year()), fmt.Sprintf("%02d", int(t.Month())))
}

// QuarantineDir is quarantine/.
func (l Layout) QuarantineDir() string { return l.join(l.Dirs.Quarantine) }

// ReportsDir is reports/.
func (l Layout) ReportsDir() string { return l.join(l.Dirs.Reports) }

// WriteDirs are the directories intake writes to, relative to Root
// (sftpconn.EnsureDirs makes sure of them on the site).
func (l Layout) WriteDirs(worker string) []string {
	return []string{l.Dirs.Ready, path.Join(l.Dirs.Processing, worker), l.Dirs.Quarantine, l.Dirs.Reports, l.Dirs.Archive}
}

// ProcessingMoves reports whether next puts the partner's processing dir
// somewhere else than c does: another site or login, root or
// dirs.processing, or claim: record (which has none). Nothing looks at a
// processing dir the config no longer names: not this daemon's polls, not
// another replica's adoption, not the reconciler.
func (c *Config) ProcessingMoves(next *Config) bool {
	if c.Records() {
		return false
	}
	return next.Records() || c.treeMoves(next) || path.Clean(c.Dirs.Processing) != path.Clean(next.Dirs.Processing)
}

// FinishDirsMove reports whether next puts the partner's quarantine or
// archive dir somewhere else than c does: another site or login, root,
// dirs.quarantine or dirs.archive, or claim: record (which moves no
// file). A hold or an archive moves its file there before it records
// the file's end; a run that fails in between leaves the row live, and
// the row's next run (its owner's, or a reconciler's after a takeover)
// looks for the file where the config in force then puts these dirs,
// never where the move put it.
func (c *Config) FinishDirsMove(next *Config) bool {
	if c.Records() {
		return false
	}
	return next.Records() || c.treeMoves(next) || path.Clean(c.Dirs.Quarantine) != path.Clean(next.Dirs.Quarantine) ||
		path.Clean(c.Dirs.Archive) != path.Clean(next.Dirs.Archive)
}

// treeMoves reports whether next puts the partner's tree on another site,
// login or root than c does.
func (c *Config) treeMoves(next *Config) bool {
	return !strings.EqualFold(c.SFTP.Address, next.SFTP.Address) || c.SFTP.User != next.SFTP.User ||
		path.Clean(c.SFTP.Root) != path.Clean(next.SFTP.Root)
}
