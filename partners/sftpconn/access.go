package sftpconn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/partner-intake/partner-intake/partners"
)

// accessProbePrefix names ProbeAccess's file in ready/: a dotfile, which
// no readiness mode ever takes and the reconciler ignores.
const accessProbePrefix = ".intake-access-probe-"

var errStopListing = errors.New("stop listing")

// ProbeAccess finds which operations the account may do in ready/: it
// lists ready/ (stopping at the first regular file), creates a dotfile
// there, reads it back (or, when it cannot create one, reads one byte of
// the first regular file listed), renames it to another dotfile and
// deletes it. A partner's own files are only ever read. An error is one
// that leaves nothing to say (no connection, no ready/).
func ProbeAccess(ctx context.Context, p *partners.Config, emptyDirsVanish bool) (partners.Access, error) {
	a := partners.Access{List: partners.CanNo, Read: partners.CanUntried, Create: partners.CanNo, Rename: partners.CanUntried, Delete: partners.CanUntried}
	s, err := Dial(ctx, p)
	if err != nil {
		return a, err
	}
	defer s.Close()
	s.SetEmptyDirsVanish(emptyDirsVanish) // the server's profile, when measured
	ready := s.Layout.ReadyDir()
	first := ""
	err = s.ListDir(ctx, ready, func(e os.FileInfo) error {
		if e.Mode().IsRegular() && partners.SafeName(e.Name()) && !strings.HasPrefix(e.Name(), accessProbePrefix) {
			first = e.Name()
			return errStopListing
		}
		return nil
	})
	switch {
	case err == nil || errors.Is(err, errStopListing):
		a.List = partners.CanYes
	case IsNotExist(err):
		return a, fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	probe := path.Join(ready, accessProbePrefix+hex.EncodeToString(b[:]))
	body := []byte("intake access probe\n")
	if f, err := s.Create(probe); err == nil {
		_, werr := f.Write(body)
		f.Close()
		a.Create = partners.CanYes
		if werr != nil {
			a.Create = partners.CanNo // created but not writable: as good as not
		}
		a.Read = canRead(s, probe)
		a.Rename = partners.CanNo
		moved := probe + "-renamed"
		if err := s.Rename(probe, moved); err == nil {
			a.Rename, probe = partners.CanYes, moved
		}
		a.Delete = partners.CanNo
		if err := s.Remove(probe); err == nil {
			a.Delete = partners.CanYes
		} else {
			a.Left = probe
		}
	} else if first != "" {
		a.Read = canRead(s, path.Join(ready, first))
	}
	return a, nil
}

// canRead reads one byte of the file (an empty file reads as EOF).
func canRead(s *Session, name string) partners.Can {
	f, err := s.Open(name)
	if err != nil {
		return partners.CanNo
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil && !errors.Is(err, io.EOF) {
		return partners.CanNo
	}
	return partners.CanYes
}
