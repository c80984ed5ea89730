package partners

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"time"

	"github.com/pkg/sftp"
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

// EnsureDirs creates the directories intake writes to when they are
// missing. A lost claim race and a missing target directory both read as
// "no such file", so the claim target must exist before a rename's error
// can be read as a lost race. The directories are asked about together
// (pkg/sftp keeps the requests in flight side by side): one round trip
// when they exist, not one per directory. It returns the directories.
func (l Layout) EnsureDirs(c *sftp.Client, worker string) ([]string, error) {
	return l.ensureDirs(c, worker, nil)
}

// writeDirs are the directories intake writes to, relative to Root.
func (l Layout) writeDirs(worker string) []string {
	return []string{l.Dirs.Ready, path.Join(l.Dirs.Processing, worker), l.Dirs.Quarantine, l.Dirs.Reports, l.Dirs.Archive}
}

// ensureDirs is EnsureDirs for the directories not in have (made sure of
// already).
func (l Layout) ensureDirs(c *sftp.Client, worker string, have map[string]bool) ([]string, error) {
	var dirs []string
	for _, d := range l.writeDirs(worker) {
		dirs = append(dirs, l.join(d))
	}
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, d := range dirs {
		if have[d] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.MkdirAll(d) // safe beside another MkdirAll of a shared parent: an existing directory is success
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("create remote %s: %w", dirs[i], err)
		}
	}
	return dirs, nil
}

// IsPermission reports whether err means the site refused access to the
// remote path.
func IsPermission(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, os.ErrPermission) {
		return true
	}
	var se *sftp.StatusError
	return errors.As(err, &se) && se.FxCode() == sftp.ErrSSHFxPermissionDenied
}

// IsNotExist reports whether err means the remote path does not exist.
func IsNotExist(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	var se *sftp.StatusError
	return errors.As(err, &se) && se.FxCode() == sftp.ErrSSHFxNoSuchFile
}
