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

// MoveClaimed is a takeover's move of a claimed file from from to to
// (MoveClaim) with its manifest (its name in manifest, "" for none), which
// lies beside its file wherever the file is: the manifest follows the file
// into to's dir, also when the file was found gone from from. err is the
// move's as MoveClaim gives it, except that a manifest that stays beside
// from takes its file back there: ErrNotMoved, the pair at from, where the
// taker points its row back. left is a manifest the move could not keep
// beside its file (its move failed and the file could not go back to it,
// or the site did not say where it is): the taker reports it, and the
// reconciler's look through processing/ moves a manifest beside no file to
// the live row that lacks it. A manifest found nowhere is neither: its
// file's download holds the file.
func MoveClaimed(s *sftpconn.Session, from, to, manifest string) (left *ManifestLeft, err error) {
	err = MoveClaim(s, from, to)
	if manifest == "" || errors.Is(err, ErrNotMoved) {
		return nil, err
	}
	mfrom, mto := path.Join(path.Dir(from), manifest), path.Join(path.Dir(to), manifest)
	merr := MoveClaim(s, mfrom, mto)
	if merr == nil || sftpconn.IsNotExist(merr) {
		return nil, err
	}
	if err == nil && errors.Is(merr, ErrNotMoved) {
		// the manifest is still beside from: its file goes back to it
		berr := MoveClaim(s, to, from)
		if berr == nil {
			return nil, fmt.Errorf("its manifest: %w", merr)
		}
		merr = fmt.Errorf("%w; the file could not go back beside it: %w", merr, berr)
	}
	return &ManifestLeft{Path: mfrom, Err: merr}, err
}

// ManifestLeft is a manifest a takeover's move left apart from its file,
// at Path as far as the site said.
type ManifestLeft struct {
	Path string
	Err  error
}

func (e *ManifestLeft) Error() string {
	return fmt.Sprintf("the manifest %s was left apart from its file: %v", e.Path, e.Err)
}

func (e *ManifestLeft) Unwrap() error { return e.Err }
