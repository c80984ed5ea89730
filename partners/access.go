package partners

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
)

// Can is one operation's verdict in ProbeAccess.
type Can string

// Verdicts.
const (
	CanYes     Can = "yes"
	CanNo      Can = "no"
	CanUntried Can = "untried" // nothing to try it on (e.g. rename when nothing could be created)
)

// Access is what the partner's account may do in ready/, as intake check
// finds it by trying: list it, read a file, create a file, rename it,
// delete it.
type Access struct {
	List, Read, Create, Rename, Delete Can
	// Left is a probe file ProbeAccess could not delete ("" normally).
	Left string
}

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
func ProbeAccess(ctx context.Context, p *Config, emptyDirsVanish bool) (Access, error) {
	a := Access{List: CanNo, Read: CanUntried, Create: CanNo, Rename: CanUntried, Delete: CanUntried}
	s, err := Dial(ctx, p)
	if err != nil {
		return a, err
	}
	defer s.Close()
	s.SetEmptyDirsVanish(emptyDirsVanish) // the server's profile, when measured
	ready := s.Layout.ReadyDir()
	first := ""
	err = s.ListDir(ctx, ready, func(e os.FileInfo) error {
		if e.Mode().IsRegular() && SafeName(e.Name()) && !strings.HasPrefix(e.Name(), accessProbePrefix) {
			first = e.Name()
			return errStopListing
		}
		return nil
	})
	switch {
	case err == nil || errors.Is(err, errStopListing):
		a.List = CanYes
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
		a.Create = CanYes
		if werr != nil {
			a.Create = CanNo // created but not writable: as good as not
		}
		a.Read = canRead(s, probe)
		a.Rename = CanNo
		moved := probe + "-renamed"
		if err := s.Rename(probe, moved); err == nil {
			a.Rename, probe = CanYes, moved
		}
		a.Delete = CanNo
		if err := s.Remove(probe); err == nil {
			a.Delete = CanYes
		} else {
			a.Left = probe
		}
	} else if first != "" {
		a.Read = canRead(s, path.Join(ready, first))
	}
	return a, nil
}

// canRead reads one byte of the file (an empty file reads as EOF).
func canRead(s *Session, name string) Can {
	f, err := s.Open(name)
	if err != nil {
		return CanNo
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil && !errors.Is(err, io.EOF) {
		return CanNo
	}
	return CanYes
}

// String is the verdicts on one line.
func (a Access) String() string {
	return fmt.Sprintf("list %s, read %s, create %s, rename %s, delete %s", a.List, a.Read, a.Create, a.Rename, a.Delete)
}

// Fits says which claim modes the account allows. Every built mode
// (readiness rename, manifest and stable) claims by RENAME out of ready/
// and writes processing/, archive/, quarantine/ and reports/: it needs
// list, read, create and rename. An account that may list and read only
// fits readiness stable with claim: record (the claim kept in
// PostgreSQL, nothing on the site moved or written).
func (a Access) Fits() string {
	switch {
	case a.List == CanYes && a.Read == CanYes && a.Create == CanYes && a.Rename == CanYes:
		return "readiness rename, manifest or stable (claims by rename); claim: record too"
	case a.List == CanYes && a.Read == CanYes:
		return "only readiness: stable with claim: record (the claim kept in PostgreSQL; nothing on the site moved or written); claiming by rename needs create and rename"
	case a.List == CanYes && a.Read == CanUntried:
		return "unknown: ready/ holds no file to read and none could be created; every built mode needs read, create and rename"
	default:
		return "none: the account cannot list and read ready/"
	}
}
