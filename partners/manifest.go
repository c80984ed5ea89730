package partners

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/partner-intake/partner-intake/internal/names"
)

// ManifestSuffix names a data file's completion manifest: <name>.complete.
const ManifestSuffix = ".complete"

// maxManifestBytes bounds a manifest; it is small JSON.
const maxManifestBytes = 64 << 10

// Manifest is what a partner states about a data file.
type Manifest struct {
	Bytes   int64  `json:"bytes"`
	SHA256  string `json:"sha256"`
	BatchID string `json:"batch_id,omitempty"`
	Rows    *int64 `json:"rows,omitempty"`
}

// ErrManifestInvalid: a manifest's bytes are not one (ParseManifest): a
// fault of the partner's, where an error reading them is the site's or
// the network's.
var ErrManifestInvalid = errors.New("manifest invalid")

// ReadManifest reads the manifest at p and parses it (ParseManifest): on
// the listing channel in two round trips (ReadWhole), else through
// pkg/sftp. A manifest that does not parse is ErrManifestInvalid.
func (s *Session) ReadManifest(p string) (*Manifest, error) {
	b, err := s.ReadWhole(p, maxManifestBytes+1)
	if err == nil {
		return parsed(parseManifest(b))
	}
	if errors.Is(err, ErrNotRegular) {
		return nil, fmt.Errorf("%w: %w", ErrManifestInvalid, err)
	}
	if !errors.Is(err, ErrNoListingChannel) && !errors.Is(err, errPartRead) && !s.ListingChannelLost(err) {
		return nil, err
	}
	// through pkg/sftp: an LSTAT first, as on the listing channel
	if fi, err := s.Lstat(p); err != nil {
		return nil, err
	} else if fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("%w: %s: %w (a symlink)", ErrManifestInvalid, p, ErrNotRegular)
	}
	f, err := s.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err = io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, s.Deadline(err)
	}
	return parsed(parseManifest(b))
}

// parsed marks parseManifest's error as ErrManifestInvalid.
func parsed(m *Manifest, err error) (*Manifest, error) {
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifestInvalid, err)
	}
	return m, nil
}

// ParseManifest reads a manifest strictly: unknown fields, trailing data
// and missing bytes/sha256 are errors.
func ParseManifest(r io.Reader) (*Manifest, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	return parseManifest(b)
}

// parseManifest is ParseManifest over the bytes read (at most one more
// than maxManifestBytes).
func parseManifest(b []byte) (*Manifest, error) {
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("manifest is larger than %d bytes", maxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("manifest: trailing data after the JSON object")
	}
	if m.Bytes < 0 || !names.SHA256Hex(m.SHA256) {
		return nil, fmt.Errorf("manifest: bytes must be >= 0 and sha256 64 lower-case hex digits")
	}
	if m.Rows != nil && *m.Rows < 0 {
		return nil, fmt.Errorf("manifest: rows must be >= 0")
	}
	return &m, nil
}
