// Package spool is the local, content-addressed store of partner files.
//
// A file is streamed once into a temporary name while it is hashed; only
// after the byte count is checked and the data is fsynced is it renamed to
// <dir>/<partner>/sha256/<ab>/<hash>. A half-written file is therefore never
// visible under a content name, and names are generated, never derived from
// what a partner sent. Every directory the spool makes is 0700 and every
// file it writes 0600, whatever the umask: partners' bytes are readable by
// the daemon's user alone.
package spool

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/partner-intake/partner-intake/internal/names"
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

// Spool is a directory of partner files. Several replicas may share one
// spool directory: temporary files carry the writing worker's id, so a
// restarted worker can remove exactly its own leftovers.
type Spool struct {
	dir    string
	worker string
}

// ForWorker returns the spool as seen by one worker: its temporary files
// are named after it.
func (s *Spool) ForWorker(worker string) (*Spool, error) {
	if !names.WorkerID(worker) {
		return nil, fmt.Errorf("spool: bad worker id %q", worker)
	}
	return &Spool{dir: s.dir, worker: worker}, nil
}

// New opens (and creates) the spool at dir.
func New(dir string) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	return &Spool{dir: abs, worker: "anon"}, nil
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
func (s *Spool) Put(partner string, want, max int64, src Source, opts ...PutOption) (e Entry, err error) {
	var o putOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !names.PartnerID(partner) {
		return Entry{}, fmt.Errorf("spool: bad partner id %q", partner)
	}
	if o.unkept {
		u := newUnkept()
		for _, fn := range o.follow {
			fn(u.follower())
		}
		defer func() { u.finish(err) }()
		return stream(partner, want, max, src, u)
	}
	tmpDir := filepath.Join(s.dir, partner, "tmp")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return Entry{}, fmt.Errorf("spool: %w", err)
	}
	tmpPath := filepath.Join(tmpDir, s.worker+"."+randomName()+TempSuffix)
	f, direct, err := openFile(tmpPath, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600, o.direct && writesBehind(want))
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
	var fileW io.Writer = f
	if direct {
		fileW = &directWriter{f: f, direct: true}
	}
	var nw *notifyWriter
	if len(o.follow) > 0 {
		nw = &notifyWriter{w: fileW}
		for _, fn := range o.follow {
			fl, ferr := newFollower(tmpPath, direct)
			if ferr != nil {
				return Entry{}, fmt.Errorf("spool: %w", ferr)
			}
			defer func() { fl.finish(err) }()
			nw.fls = append(nw.fls, fl)
			fn(fl)
		}
		fileW = nw
	}
	e, err = stream(partner, want, max, src, fileW)
	if err != nil {
		return Entry{}, err
	}
	if nw != nil {
		for _, fl := range nw.fls {
			fl.writtenWhole()
		}
	}
	final := s.Path(e.Partner, e.SHA256)
	if s.Has(e.Partner, e.SHA256, e.Size) {
		// Content-addressed: the same bytes are already spooled (and were
		// made durable when they were). The copy just streamed is dropped
		// without an fsync: an exact duplicate costs one pass, no flush.
		// The directory is synced in case the first Put died before it.
		return e, syncDir(filepath.Dir(final))
	}
	if err := f.Sync(); err != nil {
		return Entry{}, fmt.Errorf("spool: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return Entry{}, fmt.Errorf("spool: close: %w", err)
	}
	_, statErr := os.Stat(filepath.Dir(final))
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return Entry{}, fmt.Errorf("spool: %w", err)
	}
	if err := os.Rename(tmpPath, final); err != nil {
		return Entry{}, fmt.Errorf("spool: promote: %w", err)
	}
	keep = true
	dirs := []string{filepath.Dir(final)}
	if statErr != nil { // the prefix directory is new: its entry must last too
		dirs = append(dirs, newDirParents(final)...)
	}
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return Entry{}, err
		}
	}
	return e, nil
}

// PutAll spools several files whose bytes are already in memory (a group
// of small files): each is hashed, written to a temporary name and
// flushed, then all are renamed to their content names, and each
// directory they landed in is flushed once, after all the renames (one
// directory flush per group instead of one per file). It returns when
// every file is durable under its name; an error leaves no file under a
// content name that is not complete (temporary files are removed, or
// cleared by ClearOwnTemp after a crash).
func (s *Spool) PutAll(partner string, files [][]byte) ([]Entry, error) {
	if !names.PartnerID(partner) {
		return nil, fmt.Errorf("spool: bad partner id %q", partner)
	}
	tmpDir := filepath.Join(s.dir, partner, "tmp")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	out := make([]Entry, len(files))
	var temps, finals []string
	var data [][]byte
	dirs := map[string]bool{}
	for i, b := range files {
		sum := sha256.Sum256(b)
		e := Entry{Partner: partner, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
		out[i] = e
		final := s.Path(partner, e.SHA256)
		dirs[filepath.Dir(final)] = true
		if s.Has(partner, e.SHA256, e.Size) || slices.Contains(finals, final) {
			continue // content-addressed: already held (its directory is synced below)
		}
		temps = append(temps, filepath.Join(tmpDir, s.worker+"."+randomName()+TempSuffix))
		finals, data = append(finals, final), append(data, b)
	}
	defer func() {
		for _, t := range temps {
			os.Remove(t) // nothing for the ones renamed
		}
	}()
	// The flushes run side by side: the filesystem commits its journal
	// for several at once (measured in docs/performance.md).
	if err := parallel(len(temps), func(i int) error { return writeSynced(temps[i], data[i]) }); err != nil {
		return nil, err
	}
	for i, tmp := range temps {
		err := os.Rename(tmp, finals[i])
		if errors.Is(err, os.ErrNotExist) { // the first file under this prefix
			if err = os.MkdirAll(filepath.Dir(finals[i]), 0o700); err == nil {
				err = os.Rename(tmp, finals[i])
			}
			for _, d := range newDirParents(finals[i]) {
				dirs[d] = true
			}
		}
		if err != nil {
			return nil, fmt.Errorf("spool: promote: %w", err)
		}
	}
	var dl []string
	for d := range dirs {
		dl = append(dl, d)
	}
	if err := parallel(len(dl), func(i int) error { return syncDir(dl[i]) }); err != nil {
		return nil, err
	}
	return out, nil
}

// newDirParents are the directories whose entries a new prefix directory
// of final (and a new sha256/ and partner directory above it) live in:
// the partner's sha256/ directory, the partner's and the spool's own,
// flushed so the new directories last (a partner's first file makes all
// three; at most 256 prefix directories a partner ever do).
func newDirParents(final string) []string {
	sha := filepath.Dir(filepath.Dir(final))
	partner := filepath.Dir(sha)
	return []string{sha, partner, filepath.Dir(partner)}
}

// parallel runs fn(0..n-1) on up to 8 goroutines and returns the first
// error.
func parallel(n int, fn func(int) error) error {
	var next atomic.Int64
	errs := make(chan error, 8)
	workers := min(n, 8)
	for range workers {
		go func() {
			var first error
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if err := fn(int(i)); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// writeSynced creates path (which must not exist) with data, flushed.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("spool: write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("spool: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("spool: close: %w", err)
	}
	return nil
}

// Same streams src through sha256 alone, writing nothing, and reports
// whether the bytes are those of the spooled file sha (size included). It
// is for a file that can only be a duplicate of spooled bytes or differ
// from them: when they are the same, the copy needs no temp file, no
// writes and no flush. When they differ, the caller downloads again with
// Put. want and max mean what they mean for Put.
func (s *Spool) Same(partner, sha string, want, max int64, src Source) (e Entry, same bool, err error) {
	if !names.PartnerID(partner) {
		return Entry{}, false, fmt.Errorf("spool: bad partner id %q", partner)
	}
	e, err = stream(partner, want, max, src, nil)
	if err != nil {
		return Entry{}, false, err
	}
	return e, e.SHA256 == sha && s.Has(partner, sha, e.Size), nil
}

// stream runs src once into sha256 and, when to is not nil, into to:
// behind the download for large or unknown sizes, stopped past max bytes,
// and checked against want when want >= 0.
func stream(partner string, want, max int64, src Source, to io.Writer) (Entry, error) {
	h := sha256.New()
	var sink io.Writer = h
	if to != nil {
		sink = io.MultiWriter(h, to)
	}
	var bw *behind
	if writesBehind(want) {
		bw = newBehind(sink, behindBuf, behindDepth)
		sink = bw
	}
	lw := &limitWriter{w: sink, left: max}
	n, err := src(lw)
	if bw != nil {
		if cerr := bw.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	if lw.over {
		return Entry{}, ErrTooLarge
	}
	if err != nil {
		return Entry{}, fmt.Errorf("spool: stream: %w", err)
	}
	if want >= 0 && n != want {
		return Entry{}, &ShortError{Got: n, Want: want}
	}
	return Entry{Partner: partner, SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// Path is where the file with this hash lives. It panics on a malformed
// hash or partner id, which only a programming error can produce.
func (s *Spool) Path(partner, sha string) string {
	if !names.PartnerID(partner) || !names.SHA256Hex(sha) {
		panic(fmt.Sprintf("spool: bad key %q/%q", partner, sha))
	}
	return filepath.Join(s.dir, partner, "sha256", sha[:2], sha)
}

// Open opens a spooled file for reading.
func (s *Spool) Open(partner, sha string) (*os.File, error) {
	if !names.PartnerID(partner) || !names.SHA256Hex(sha) {
		return nil, fmt.Errorf("spool: bad key %q/%q", partner, sha)
	}
	return os.Open(s.Path(partner, sha))
}

// Has reports whether the spool holds the file, with the expected size.
func (s *Spool) Has(partner, sha string, size int64) bool {
	if !names.PartnerID(partner) || !names.SHA256Hex(sha) {
		return false
	}
	st, err := os.Lstat(s.Path(partner, sha))
	return err == nil && st.Mode().IsRegular() && st.Size() == size
}

// Keep reports whether the spool holds the file with the expected size,
// and when it does renews its mtime, which retention's purge judges by:
// a purge that decided to remove it before looks again right before the
// removal and keeps it (ops.Purge). A replay keeps its bytes so before it
// records its row.
func (s *Spool) Keep(partner, sha string, size int64) bool {
	if !s.Has(partner, sha, size) {
		return false
	}
	now := time.Now()
	return os.Chtimes(s.Path(partner, sha), now, now) == nil && s.Has(partner, sha, size)
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

// ownTemp reports whether name is a temporary file of this worker:
// <worker>.<32 hex>.tmp exactly. A prefix alone would take worker
// "web1"'s for "web1.example.com"'s (two ids, one spool on one host).
func (s *Spool) ownTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, s.worker+".")
	if !ok {
		return false
	}
	rnd, ok := strings.CutSuffix(rest, TempSuffix)
	if !ok || len(rnd) != 32 {
		return false
	}
	_, err := hex.DecodeString(rnd)
	return err == nil
}

// ClearOwnTemp removes this worker's temporary files of partner: at start
// a worker has no download in flight, so any it finds were left by a crash.
func (s *Spool) ClearOwnTemp(partner string) (int, error) {
	dir := filepath.Join(s.dir, partner, "tmp")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("spool: %w", err)
	}
	n := 0
	for _, e := range ents {
		if s.ownTemp(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return n, fmt.Errorf("spool: %w", err)
			}
			n++
		}
	}
	return n, nil
}

// Remove deletes a spooled file (a derived copy the caller no longer
// needs, such as a compressed file's expanded bytes); a missing one is no
// error.
func (s *Spool) Remove(partner, sha string) error {
	if !names.PartnerID(partner) {
		return fmt.Errorf("spool: bad partner id %q", partner)
	}
	if err := os.Remove(s.Path(partner, sha)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("spool: %w", err)
	}
	return nil
}

// Usage is the bytes the spool holds for a partner (spooled files and
// temporary ones). It walks the partner's directory: a cost in the number
// of files the partner's retention keeps.
func (s *Spool) Usage(partner string) (int64, error) {
	if !names.PartnerID(partner) {
		return 0, fmt.Errorf("spool: bad partner id %q", partner)
	}
	var total int64
	err := filepath.WalkDir(filepath.Join(s.dir, partner), func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed meanwhile (purge), or nothing spooled yet
			}
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("spool: usage of %s: %w", partner, err)
	}
	return total, nil
}

// FreeBytes is the space left for unprivileged writers on the spool's disk.
func (s *Spool) FreeBytes() (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return 0, fmt.Errorf("spool: statfs: %w", err)
	}
	return st.Bavail * uint64(st.Bsize), nil
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

// Probe checks that the spool directory is writable.
func (s *Spool) Probe() error {
	f, err := os.CreateTemp(s.dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("spool not writable: %w", err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// CreateTemp opens a new temporary file of partner's, for bytes that are
// not a spooled file (a rejects report on its way to the site): named
// like every other temporary file of the worker, so one a crash leaves
// behind is removed with them (ClearOwnTemp, TempFiles). The caller
// closes and removes it.
func (s *Spool) CreateTemp(partner string) (*os.File, error) {
	tmpDir := filepath.Join(s.dir, partner, "tmp")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(tmpDir, s.worker+"."+randomName()+TempSuffix), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
}

// Tighten takes away group and other bits from what the spool holds: a
// spool written by a version that left its files group-readable (or
// copied in by hand) is made the daemon's user's alone, directories 0700,
// files 0600, as the spool writes them now. It returns how many entries it
// changed; the daemon runs it once at start. A spool whose root is the
// user's alone was made (or tightened) so already: it is not walked, so a
// start does not stat every file of a large spool each time.
func (s *Spool) Tighten() (int, error) {
	if fi, err := os.Stat(s.dir); err == nil && fi.Mode().Perm()&0o077 == 0 {
		return 0, nil
	}
	n := 0
	err := filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil // the spool makes none; one is not followed
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm()&0o077 == 0 {
			return nil
		}
		if err := os.Chmod(p, fi.Mode().Perm()&want); err != nil {
			return err
		}
		n++
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("spool: tighten modes: %w", err)
	}
	return n, nil
}
