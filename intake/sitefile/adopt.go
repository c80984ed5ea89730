package sitefile

import (
	"errors"
	"fmt"
	"path"

	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// ClaimManifest makes sure the manifest of the data file claimed at
// dataPath (manifest readiness) lies beside it: it is moved there from the
// first of dirs that holds it (the dir a claim was adopted from, ready/
// when a claim's RENAME of the data file went through and its manifest's
// did not). A dir that holds a data file of the same name too is passed
// over: that manifest may be a new delivery's (the name sent again). Its
// name is returned whether or not one was found: a data file of a
// manifest feed is never taken as if it had none, and its download holds
// it when the manifest cannot be read (nothing is applied unverified). A
// failure of the site is returned. Adoption only: never on a fresh claim's
// path.
func ClaimManifest(sess *sftpconn.Session, dataPath string, dirs ...string) (string, error) {
	name := path.Base(dataPath)
	m := name + partners.ManifestSuffix
	dst := path.Join(path.Dir(dataPath), m)
	if _, err := sess.Lstat(dst); err == nil {
		return m, nil
	} else if !sftpconn.IsNotExist(err) {
		return m, fmt.Errorf("look for the manifest of %s: %w", name, err)
	}
	for _, dir := range dirs {
		if _, err := sess.Lstat(path.Join(dir, name)); err == nil {
			continue // a data file of the name there: the manifest may be its own
		} else if !sftpconn.IsNotExist(err) {
			return m, fmt.Errorf("look for the manifest of %s: %w", name, err)
		}
		err := sess.Rename(path.Join(dir, m), dst)
		if err == nil {
			return m, nil
		}
		if !sftpconn.IsNotExist(err) {
			return m, fmt.Errorf("claim the manifest of %s: %w", path.Base(dataPath), err)
		}
	}
	return m, nil
}

// MoveClaim renames a claimed file (or its manifest) into the processing
// dir of the worker taking it over; one already moved (an earlier,
// interrupted takeover: gone from from, at to) counts as done. A file
// still at from, or not known to be gone from it, is ErrNotMoved (another
// file holds the name at to, or the site refused), whatever is at to: the
// taker points its row back at from.
func MoveClaim(s *sftpconn.Session, from, to string) error {
	err := s.Rename(from, to)
	if err == nil {
		return nil
	}
	if _, ferr := s.Lstat(from); !sftpconn.IsNotExist(ferr) {
		// there, or not known to be gone: what is at to may be another
		// file that made the rename fail
		return fmt.Errorf("%w: %w", ErrNotMoved, err)
	}
	if _, serr := s.Lstat(to); serr == nil {
		return nil // moved; the rename's reply was lost
	}
	return err
}

// ErrNotMoved: a takeover's move left the file where it was.
var ErrNotMoved = errors.New("the file is still where it was")
