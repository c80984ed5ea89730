package sftpconn

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/partner-intake/partner-intake/partners"
)

// ReadManifest reads the manifest at p and parses it
// (partners.ParseManifest): on the listing channel in two round trips
// (ReadWhole), else through pkg/sftp. A manifest that does not parse is
// partners.ErrManifestInvalid.
func (s *wholeFiles) ReadManifest(p string) (*partners.Manifest, error) {
	b, err := s.ReadWhole(p, partners.MaxManifestBytes+1)
	if err == nil {
		return parsed(partners.ParseManifest(bytes.NewReader(b)))
	}
	if errors.Is(err, ErrNotRegular) {
		return nil, fmt.Errorf("%w: %w", partners.ErrManifestInvalid, err)
	}
	if !errors.Is(err, ErrNoListingChannel) && !errors.Is(err, errPartRead) && !s.ListingChannelLost(err) {
		return nil, err
	}
	// through pkg/sftp: an LSTAT first, as on the listing channel
	if fi, err := s.Lstat(p); err != nil {
		return nil, err
	} else if fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("%w: %s: %w (a symlink)", partners.ErrManifestInvalid, p, ErrNotRegular)
	}
	f, err := s.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err = io.ReadAll(io.LimitReader(f, partners.MaxManifestBytes+1))
	if err != nil {
		return nil, s.Deadline(err)
	}
	return parsed(partners.ParseManifest(bytes.NewReader(b)))
}

// parsed marks partners.ParseManifest's error as partners.ErrManifestInvalid.
func parsed(m *partners.Manifest, err error) (*partners.Manifest, error) {
	if err != nil {
		return nil, fmt.Errorf("%w: %w", partners.ErrManifestInvalid, err)
	}
	return m, nil
}
