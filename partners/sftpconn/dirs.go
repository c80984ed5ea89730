package sftpconn

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sync"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/partners"
)

// EnsureDirs creates the directories intake writes to (l.WriteDirs) when
// they are missing. A lost claim race and a missing target directory both
// read as "no such file", so the claim target must exist before a rename's
// error can be read as a lost race. The directories are asked about
// together (pkg/sftp keeps the requests in flight side by side): one round
// trip when they exist, not one per directory. It returns the directories.
func EnsureDirs(c *sftp.Client, l partners.Layout, worker string) ([]string, error) {
	return ensureDirs(c, l, worker, nil)
}

// ensureDirs is EnsureDirs for the directories not in have (made sure of
// already).
func ensureDirs(c *sftp.Client, l partners.Layout, worker string, have map[string]bool) ([]string, error) {
	var dirs []string
	for _, d := range l.WriteDirs(worker) {
		dirs = append(dirs, path.Join(l.Root, d))
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
	return isRemote(err, os.ErrPermission, sftp.ErrSSHFxPermissionDenied)
}

// IsRefused reports whether err is the site's answer refusing the request
// (an SFTP status: permission denied, failure, an operation it does not
// support), not that the path does not exist: the request reached the
// server, which said no. A lost connection or a timeout is not a refusal.
func IsRefused(err error) bool {
	var se *sftp.StatusError
	if !errors.As(err, &se) {
		return errors.Is(err, os.ErrPermission)
	}
	return se.FxCode() != sftp.ErrSSHFxNoSuchFile && se.FxCode() != sftp.ErrSSHFxOk && se.FxCode() != sftp.ErrSSHFxEOF &&
		se.FxCode() != sftp.ErrSSHFxConnectionLost && se.FxCode() != sftp.ErrSSHFxNoConnection
}

// IsNotExist reports whether err means the remote path does not exist.
func IsNotExist(err error) bool { return isRemote(err, os.ErrNotExist, sftp.ErrSSHFxNoSuchFile) }

// isRemote reports whether err is, or wraps, target (as pkg/sftp maps a
// status) or an SFTP status of code.
func isRemote(err, target, code error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, target) {
		return true
	}
	var se *sftp.StatusError
	return errors.As(err, &se) && se.FxCode() == code
}

// RegularInReady reports whether ready/<name> is a regular file on the
// site (one LSTAT): what partners.Manifests.Has asks of a manifest a
// listing passed but did not remember.
func (s *Session) RegularInReady(name string) bool {
	fi, err := s.Lstat(s.Layout.Ready(name))
	return err == nil && fi.Mode().IsRegular()
}
