package partners

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
)

// ErrRenameOverwrites means the server's plain RENAME replaces an existing
// target. Claims and never-overwrite archiving rely on RENAME failing there
// (as OpenSSH's does), so such a server is refused.
var ErrRenameOverwrites = errors.New("the server's SFTP RENAME overwrites an existing target; claims and archiving would be unsafe")

// Probe connects to the partner with its pinned host key and checks that
// ready/ exists, that intake can create and write its directories, and that
// RENAME refuses to overwrite. It leaves nothing behind.
func Probe(ctx context.Context, p *Config, worker string) error {
	s, err := Dial(ctx, p)
	if err != nil {
		return err
	}
	defer s.Close()
	ready := s.Layout.ReadyDir()
	st, err := s.Stat(ready)
	if err != nil {
		return fmt.Errorf("partner %s: dirs.ready %s: %w", p.ID, ready, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("partner %s: dirs.ready %s is not a directory", p.ID, ready)
	}
	if _, err := s.Layout.EnsureDirs(s.Client, worker); err != nil {
		return fmt.Errorf("partner %s: %w", p.ID, err)
	}
	overwrites, err := s.RenameOverwrites(worker)
	if err != nil {
		return fmt.Errorf("partner %s: %w", p.ID, err)
	}
	if overwrites {
		return fmt.Errorf("partner %s: %w", p.ID, ErrRenameOverwrites)
	}
	return nil
}

// RenameOverwrites measures whether the server's plain RENAME replaces an
// existing target: two dotfiles of intake's own in processing/<worker>/,
// one renamed onto the other, both removed after. The daemon measures it
// when it first dials a partner (and a day later), intake check every
// time: both refuse such a server (ErrRenameOverwrites).
func (s *Session) RenameOverwrites(worker string) (bool, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	dir := s.Layout.ProcessingDir(worker)
	a := path.Join(dir, ".intake-probe-a-"+hex.EncodeToString(b[:]))
	bb := path.Join(dir, ".intake-probe-b-"+hex.EncodeToString(b[:]))
	defer s.Remove(a)
	defer s.Remove(bb)
	for _, name := range []string{a, bb} {
		f, err := s.Create(name)
		if err != nil {
			return false, fmt.Errorf("%s is not writable: %w", dir, s.Deadline(err))
		}
		_, err = f.Write([]byte(name))
		f.Close()
		if err != nil {
			return false, fmt.Errorf("write in %s: %w", dir, s.Deadline(err))
		}
	}
	return s.Rename(a, bb) == nil, nil
}
