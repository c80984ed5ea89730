package partners

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/partner-intake/partner-intake/internal/names"
)

// ManifestSuffix names a data file's completion manifest: <name>.complete.
const ManifestSuffix = ".complete"

// MaxManifestBytes bounds a manifest; it is small JSON.
const MaxManifestBytes = 64 << 10

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

// ParseManifest reads a manifest strictly: unknown fields, trailing data
// and missing bytes/sha256 are errors.
func ParseManifest(r io.Reader) (*Manifest, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	return parseManifest(b)
}

// parseManifest is ParseManifest over the bytes read (at most one more
// than MaxManifestBytes).
func parseManifest(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest is larger than %d bytes", MaxManifestBytes)
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
