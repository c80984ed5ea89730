package spool_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/partner-intake/partner-intake/spool"
)

// A spool left group- and world-readable (directories 0755, files 0644)
// is made the daemon's user's alone: directories 0700, files 0600; a
// second pass changes nothing.
func TestTightenTakesGroupAndOtherBitsAway(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "acme", "sha256", "ab")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(old, "abcd")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "acme"), filepath.Join(dir, "acme", "sha256"), old} {
		os.Chmod(p, 0o755)
	}
	os.Chmod(file, 0o644)
	sp, err := spool.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sp.Tighten()
	if err != nil || n != 5 {
		t.Fatalf("tightened %d entries (%v), want the root, three directories and the file", n, err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, old: 0o700, file: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s is %04o, want %04o", p, fi.Mode().Perm(), want)
		}
	}
	if n, err := sp.Tighten(); err != nil || n != 0 {
		t.Fatalf("a second pass changed %d (%v)", n, err)
	}
}
