// Package spool is the local, content-addressed store of partner files.
//
// A file is streamed once into a temporary name while it is hashed; only
// after the byte count is checked and the data is fsynced is it renamed to
// <dir>/<partner>/sha256/<ab>/<hash>. A half-written file is therefore never
// visible under a content name, and names are generated, never derived from
// what a partner sent.
package spool

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// TempSuffix marks files still being written.
const TempSuffix = ".tmp"

// ErrTooLarge is returned when a stream exceeds its byte limit.
var ErrTooLarge = errors.New("file exceeds its byte limit")

// ShortError is returned when fewer or more bytes arrived than were expected.
type ShortError struct{ Got, Want int64 }

func (e *ShortError) Error() string {
	return fmt.Sprintf("received %d bytes, expected %d", e.Got, e.Want)
}

var (
	partnerPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	hashPattern    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Spool is a directory of partner files.
type Spool struct {
	dir string
}

// New opens (and creates) the spool at dir.
func New(dir string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	return &Spool{dir: abs}, nil
}

// Dir is the spool's root.
func (s *Spool) Dir() string { return s.dir }

// Entry is a file in the spool.
type Entry struct {
	Partner string
	SHA256  string
	Size    int64
}

// Source writes a file's bytes to w, returning how many it wrote. A
// *sftp.File's WriteTo is one: it reads with concurrent requests.
type Source func(w io.Writer) (int64, error)

// Put streams src into the spool in one pass: bytes go to the hash and the
// temporary file together (io.MultiWriter as the destination, so the
// source's fast WriteTo path stays in use). When want >= 0 the byte count
// must equal it; more than max bytes stop the stream with ErrTooLarge.
func (s *Spool) Put(partner string, want, max int64, src Source) (Entry, error) {
	if !partnerPattern.MatchString(partner) {
		return Entry{}, fmt.Errorf("spool: bad partner id %q", partner)
	}
	tmpDir := filepath.Join(s.dir, partner, "tmp")
	if err := os.MkdirAll(tmpDir, 0o750); err != nil {
		return Entry{}, fmt.Errorf("spool: %w", err)
	}
	tmpPath := filepath.Join(tmpDir, randomName()+TempSuffix)
	f, err := os.OpenFile(tmpPath, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return Entry{}, fmt.Errorf("spool: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
			os.Remove(tmpPath)
		}
	}()
	h := sha256.New()
	lw := &limitWriter{w: io.MultiWriter(h, f), left: max}
	n, err := src(lw)
	if lw.over {
		return Entry{}, ErrTooLarge
	}
	if err != nil {
		return Entry{}, fmt.Errorf("spool: stream: %w", err)
	}
	if want >= 0 && n != want {
		return Entry{}, &ShortError{Got: n, Want: want}
	}
	if err := f.Sync(); err != nil {
		return Entry{}, fmt.Errorf("spool: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return Entry{}, fmt.Errorf("spool: close: %w", err)
	}
	e := Entry{Partner: partner, SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}
	final := s.Path(e.Partner, e.SHA256)
	if err := os.MkdirAll(filepath.Dir(final), 0o750); err != nil {
		return Entry{}, fmt.Errorf("spool: %w", err)
	}
	if err := os.Rename(tmpPath, final); err != nil {
		return Entry{}, fmt.Errorf("spool: promote: %w", err)
	}
	keep = true
	if err := syncDir(filepath.Dir(final)); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// Path is where the file with this hash lives. It panics on a malformed
// hash or partner id, which only a programming error can produce.
func (s *Spool) Path(partner, sha string) string {
	if !partnerPattern.MatchString(partner) || !hashPattern.MatchString(sha) {
		panic(fmt.Sprintf("spool: bad key %q/%q", partner, sha))
	}
	return filepath.Join(s.dir, partner, "sha256", sha[:2], sha)
}

// Open opens a spooled file for reading.
func (s *Spool) Open(partner, sha string) (*os.File, error) {
	if !partnerPattern.MatchString(partner) || !hashPattern.MatchString(sha) {
		return nil, fmt.Errorf("spool: bad key %q/%q", partner, sha)
	}
	return os.Open(s.Path(partner, sha))
}

// Has reports whether the spool holds the file, with the expected size.
func (s *Spool) Has(partner, sha string, size int64) bool {
	if !partnerPattern.MatchString(partner) || !hashPattern.MatchString(sha) {
		return false
	}
	st, err := os.Lstat(s.Path(partner, sha))
	return err == nil && st.Mode().IsRegular() && st.Size() == size
}

// TempFiles lists temporary files of partner older than age.
func (s *Spool) TempFiles(partner string, age time.Duration) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, partner, "tmp"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), TempSuffix) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < age {
			continue
		}
		out = append(out, filepath.Join(s.dir, partner, "tmp", e.Name()))
	}
	return out, nil
}

type limitWriter struct {
	w    io.Writer
	left int64
	over bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left >= 0 && int64(len(p)) > l.left {
		l.over = true
		return 0, ErrTooLarge
	}
	if l.left >= 0 {
		l.left -= int64(len(p))
	}
	return l.w.Write(p)
}

func randomName() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("spool: fsync dir: %w", err)
	}
	return nil
}
