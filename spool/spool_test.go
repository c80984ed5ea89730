package spool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func src(data string) Source {
	return func(w io.Writer) (int64, error) {
		n, err := io.Copy(w, strings.NewReader(data))
		return n, err
	}
}

func noTemps(t *testing.T, s *Spool, partner string) {
	t.Helper()
	tmps, err := s.TempFiles(partner, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmps) != 0 {
		t.Fatalf("temp files left behind: %v", tmps)
	}
}

func TestPutStoresUnderTheContentHash(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := "a,b\n1,2\n"
	e, err := s.Put("acme", int64(len(data)), 1<<20, src(data))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte(data))
	if e.SHA256 != hex.EncodeToString(h[:]) || e.Size != int64(len(data)) {
		t.Fatalf("got %+v", e)
	}
	want := filepath.Join(s.Dir(), "acme", "sha256", e.SHA256[:2], e.SHA256)
	if s.Path("acme", e.SHA256) != want {
		t.Fatalf("path %s, want %s", s.Path("acme", e.SHA256), want)
	}
	b, err := os.ReadFile(want)
	if err != nil || string(b) != data {
		t.Fatalf("stored %q, %v", b, err)
	}
	if !s.Has("acme", e.SHA256, e.Size) || s.Has("other", e.SHA256, e.Size) {
		t.Fatal("Has is not scoped by partner")
	}
	noTemps(t, s, "acme")
}

func TestPutOfBytesAlreadySpooledKeepsOneEntryAndNoTemp(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data := "a,b\n1,2\n"
	first, err := s.Put("acme", int64(len(data)), 1<<20, src(data))
	if err != nil {
		t.Fatal(err)
	}
	st1, err := os.Stat(s.Path("acme", first.SHA256))
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Put("acme", int64(len(data)), 1<<20, src(data))
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Fatalf("second Put %+v, first %+v", again, first)
	}
	st2, err := os.Stat(s.Path("acme", first.SHA256))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(st1, st2) {
		t.Fatal("the spooled entry was replaced by the duplicate's copy")
	}
	noTemps(t, s, "acme")
}

func TestAShortStreamIsNeverPromoted(t *testing.T) {
	s, _ := New(t.TempDir())
	_, err := s.Put("acme", 100, 1<<20, src("only ten b"))
	var short *ShortError
	if !errors.As(err, &short) || short.Got != 10 || short.Want != 100 {
		t.Fatalf("got %v, want a ShortError 10/100", err)
	}
	noTemps(t, s, "acme")
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), "acme", "sha256")); len(ents) != 0 {
		t.Fatal("a short file was promoted")
	}
}

func TestTooLargeStopsTheStream(t *testing.T) {
	s, _ := New(t.TempDir())
	_, err := s.Put("acme", -1, 1000, src(strings.Repeat("x", 5000)))
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	noTemps(t, s, "acme")
}

func TestAFailingSourceLeavesNothing(t *testing.T) {
	s, _ := New(t.TempDir())
	boom := errors.New("connection lost")
	_, err := s.Put("acme", 10, 1<<20, func(w io.Writer) (int64, error) {
		w.Write(bytes.Repeat([]byte("x"), 5))
		return 5, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	noTemps(t, s, "acme")
}

func TestPartnerIdsArePathSafe(t *testing.T) {
	s, _ := New(t.TempDir())
	for _, p := range []string{"../x", "a/b", "", "UPPER"} {
		if _, err := s.Put(p, 1, 10, src("x")); err == nil {
			t.Fatalf("partner %q was accepted", p)
		}
	}
}

func TestTempFilesListsOnlyOldTemps(t *testing.T) {
	s, _ := New(t.TempDir())
	dir := filepath.Join(s.Dir(), "acme", "tmp")
	os.MkdirAll(dir, 0o750)
	old := filepath.Join(dir, "old"+TempSuffix)
	os.WriteFile(old, nil, 0o600)
	os.Chtimes(old, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
	os.WriteFile(filepath.Join(dir, "new"+TempSuffix), nil, 0o600)
	got, err := s.TempFiles("acme", time.Minute)
	if err != nil || len(got) != 1 || got[0] != old {
		t.Fatalf("got %v %v, want only %s", got, err, old)
	}
}

func TestClearOwnTempRemovesOnlyThisWorkersFiles(t *testing.T) {
	base, _ := New(t.TempDir())
	w1, _ := base.ForWorker("w1")
	dir := filepath.Join(base.Dir(), "acme", "tmp")
	os.MkdirAll(dir, 0o750)
	rnd := randomName()
	// w1's, then workers whose ids start like it: "w10", and "w1.example"
	// (a worker id may hold dots), whose names begin "w1." too
	for _, w := range []string{"w1", "w10", "w2", "w1.example"} {
		os.WriteFile(filepath.Join(dir, w+"."+rnd+TempSuffix), nil, 0o600)
	}
	n, err := w1.ClearOwnTemp("acme")
	if err != nil || n != 1 {
		t.Fatalf("removed %d (%v), want 1", n, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 3 {
		t.Fatalf("left %v, want the other workers' files", left)
	}
	if free, err := w1.FreeBytes(); err != nil || free == 0 {
		t.Fatalf("free bytes %d %v", free, err)
	}
}

func TestSameHashesWithoutWritingAndComparesWithTheSpooledFile(t *testing.T) {
	for _, size := range []int{100, behindMin + 12345} { // inline and write-behind hashing
		s, err := New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		data := strings.Repeat("0123456789abcdef", size/16+1)[:size]
		first, err := s.Put("acme", int64(size), 1<<30, src(data))
		if err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadDir(filepath.Join(s.Dir(), "acme", "sha256", first.SHA256[:2]))

		e, same, err := s.Same("acme", first.SHA256, int64(size), 1<<30, src(data))
		if err != nil || !same || e != first {
			t.Fatalf("size %d: same bytes: %+v %v %v, want %+v true", size, e, same, err, first)
		}
		other := data[:size-1] + "X"
		e, same, err = s.Same("acme", first.SHA256, int64(size), 1<<30, src(other))
		h := sha256.Sum256([]byte(other))
		if err != nil || same || e.SHA256 != hex.EncodeToString(h[:]) || e.Size != int64(size) {
			t.Fatalf("size %d: other bytes: %+v %v %v", size, e, same, err)
		}
		if _, same, _ = s.Same("beta", first.SHA256, int64(size), 1<<30, src(data)); same {
			t.Fatal("bytes another partner spooled counted as this partner's")
		}
		after, _ := os.ReadDir(filepath.Join(s.Dir(), "acme", "sha256", first.SHA256[:2]))
		if len(after) != len(before) {
			t.Fatalf("Same wrote a spool entry: %d -> %d", len(before), len(after))
		}
		noTemps(t, s, "acme")
		if _, err := os.Stat(filepath.Join(s.Dir(), "beta")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Same made spool directories for a partner with nothing spooled: %v", err)
		}
		// a damaged entry (another size) is not the same bytes
		if err := os.Truncate(s.Path("acme", first.SHA256), int64(size/2)); err != nil {
			t.Fatal(err)
		}
		if _, same, _ = s.Same("acme", first.SHA256, int64(size), 1<<30, src(data)); same {
			t.Fatal("a truncated spool entry counted as the same bytes")
		}
	}
	s, _ := New(t.TempDir())
	var short *ShortError
	if _, _, err := s.Same("acme", strings.Repeat("0", 64), 100, 1<<20, src("only ten b")); !errors.As(err, &short) {
		t.Fatalf("got %v, want a ShortError", err)
	}
	if _, _, err := s.Same("acme", strings.Repeat("0", 64), -1, 1000, src(strings.Repeat("x", 5000))); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

func TestPutAllStoresEachFileUnderItsHashOnce(t *testing.T) {
	s, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, _ = s.ForWorker("w1")
	held, err := s.Put("acme", 4, 1<<20, src("x,y\n"))
	if err != nil {
		t.Fatal(err)
	}
	files := [][]byte{[]byte("a\n1\n"), []byte("b\n2\n"), []byte("a\n1\n"), []byte("x,y\n"), {}}
	es, err := s.PutAll("acme", files)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != len(files) {
		t.Fatalf("%d entries for %d files", len(es), len(files))
	}
	for i, e := range es {
		sum := sha256.Sum256(files[i])
		if e.SHA256 != hex.EncodeToString(sum[:]) || e.Size != int64(len(files[i])) || e.Partner != "acme" {
			t.Fatalf("entry %d: %+v", i, e)
		}
		got, err := os.ReadFile(s.Path("acme", e.SHA256))
		if err != nil || !bytes.Equal(got, files[i]) {
			t.Fatalf("entry %d: spooled bytes %q (%v), want %q", i, got, err, files[i])
		}
	}
	if es[0].SHA256 != es[2].SHA256 || es[3].SHA256 != held.SHA256 {
		t.Fatal("the same bytes got different entries")
	}
	noTemps(t, s, "acme")
	if _, err := s.PutAll("Bad/Partner", files); err == nil {
		t.Fatal("a bad partner id was accepted")
	}
}

// Every directory the spool makes is 0700 and every file it writes 0600,
// whatever the process's umask lets through: partners' bytes are the
// daemon's user's alone.
func TestSpoolDirectoriesAndFilesAreTheOwnersAlone(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	root := filepath.Join(t.TempDir(), "spool")
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = s.ForWorker("w1")
	if _, err := s.Put("acme", 4, 1<<20, src("a,b\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutAll("globex", [][]byte{[]byte("c\n1\n"), []byte("d\n2\n")}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", p, fi.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 8 { // root, two partners with their tmp/, sha256/ and file
		t.Fatalf("walked %d entries", n)
	}
}

func TestCreateTempLeftByACrashIsClearedWithTheWorkersTemp(t *testing.T) {
	base, _ := New(t.TempDir())
	w1, _ := base.ForWorker("w1")
	f, err := w1.CreateTemp("acme")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line,column,reason,outcome,detail\n")
	f.Close() // never removed: a crash
	n, err := w1.ClearOwnTemp("acme")
	if err != nil || n != 1 {
		t.Fatalf("removed %d (%v), want the report's temporary file", n, err)
	}
	if _, err := os.Stat(f.Name()); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", f.Name(), err)
	}
}

// A new prefix directory's entry lasts only once every directory above it
// that may be new is flushed too: the partner's sha256/, the partner's
// directory, and the spool's own, which holds a new partner's entry.
func TestANewPrefixDirectoryFlushesEveryDirectoryAboveIt(t *testing.T) {
	root := t.TempDir()
	s, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	final := s.Path("p1", strings.Repeat("ab", 32))
	got := newDirParents(final)
	want := []string{filepath.Join(root, "p1", "sha256"), filepath.Join(root, "p1"), root}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("flushed %v, want %v", got, want)
	}
}
