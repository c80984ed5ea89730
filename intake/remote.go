package intake

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"

	"github.com/partner-intake/partner-intake/partners"
)

// ErrRemoteLost: the claimed file is gone from processing/ and no earlier
// move of it can be found (moved or deleted by hand). Matrix row 12.
var ErrRemoteLost = errors.New("the claimed remote file is gone")

// moveOnce renames src to the first free name from candidates, never
// overwriting (SFTP RENAME fails when the target exists; candidate names
// carry the intake id, so the first is free unless this very step ran
// before). The common case costs one request; only a refused rename asks
// more. When src is already gone and a candidate exists, an earlier
// attempt moved it: that candidate is returned, so a resumed step is
// idempotent.
func moveOnce(s *partners.Session, src string, candidates []string) (string, error) {
	if err := s.EnsureDir(path.Dir(candidates[0])); err != nil {
		return "", fmt.Errorf("create %s: %w", path.Dir(candidates[0]), err)
	}
	if err := s.Rename(src, candidates[0]); err == nil {
		return candidates[0], nil
	}
	if _, err := s.Lstat(src); partners.IsNotExist(err) {
		for i := len(candidates) - 1; i >= 0; i-- {
			if _, err := s.Lstat(candidates[i]); err == nil {
				return candidates[i], nil
			}
		}
		return "", fmt.Errorf("move %s: %w", src, ErrRemoteLost)
	} else if err != nil {
		return "", fmt.Errorf("stat %s: %w", src, err)
	}
	var last error
	for _, dst := range candidates {
		if _, err := s.Lstat(dst); err == nil {
			continue // taken: never overwrite
		}
		if last = s.Rename(src, dst); last == nil {
			return dst, nil
		}
	}
	return "", fmt.Errorf("move %s: no free target name: %w", src, last)
}

// uniqueNames returns base followed by base with .1 ... .n before ext.
func uniqueNames(dir, stem, ext string, n int) []string {
	out := []string{path.Join(dir, stem+ext)}
	for i := 1; i <= n; i++ {
		out = append(out, path.Join(dir, fmt.Sprintf("%s.%d%s", stem, i, ext)))
	}
	return out
}

// putFile writes data to dir/name atomically: into a hidden temporary name,
// then renamed. An existing target (an earlier attempt finished) is kept:
// the rename onto it is refused and the temporary file removed.
func putFile(s *partners.Session, dir, name string, data []byte) (string, error) {
	dst := path.Join(dir, name)
	if err := s.EnsureDir(dir); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := path.Join(dir, "."+name+"."+hex.EncodeToString(b[:])+".tmp")
	f, err := s.Create(tmp)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		s.Remove(tmp)
		return "", fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		s.Remove(tmp)
		return "", fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := s.Rename(tmp, dst); err != nil {
		s.Remove(tmp)
		if _, serr := s.Lstat(dst); serr == nil {
			return dst, nil
		}
		return "", fmt.Errorf("publish %s: %w", dst, err)
	}
	return dst, nil
}
