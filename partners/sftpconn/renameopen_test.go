package sftpconn_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// RenameAndOpen's OPEN and LSTAT go out behind its RENAME, never before:
// on OpenSSH, which answers in order, every one of many claims opens
// and stats the file it just moved (an OPEN sent ahead of its RENAME would
// find nothing there). A rename that fails gives no file, even where a
// file already sits at the new name.
func TestRenameAndOpenOpensWhatTheRenameMoved(t *testing.T) {
	p := partner(t)
	s := dialed(t, p)
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		name := fmt.Sprintf("f%03d.csv", i)
		body := fmt.Sprintf("id\n%d\n", i)
		if err := os.WriteFile(filepath.Join(p.SFTP.Root, "ready", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		o, err := s.RenameAndOpen(s.Layout.Ready(name), s.Layout.Processing("w1", name))
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		f, st, err := o.Wait()
		if err != nil {
			t.Fatalf("claim %d: the file behind the rename: %v", i, err)
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(b) != body || st.Size() != int64(len(body)) {
			t.Fatalf("claim %d: read %q (stat %d bytes), %v; want %q", i, b, st.Size(), err, body)
		}
	}
	// the new name is taken: the rename fails, and nothing is handed over
	stale := filepath.Join(p.SFTP.Root, "processing", "w1", "taken.csv")
	os.WriteFile(stale, []byte("stale\n"), 0o644)
	os.WriteFile(filepath.Join(p.SFTP.Root, "ready", "taken.csv"), []byte("id\n1\n"), 0o644)
	if o, err := s.RenameAndOpen(s.Layout.Ready("taken.csv"), s.Layout.Processing("w1", "taken.csv")); err == nil || o != nil {
		t.Fatalf("a rename onto a taken name: %v, %v", o, err)
	}
	if b, _ := os.ReadFile(stale); string(b) != "stale\n" {
		t.Fatalf("the file at the taken name changed: %q", b)
	}
	// the source gone (another replica claimed it): not-exist, nothing handed over
	o, err := s.RenameAndOpen(s.Layout.Ready("gone.csv"), s.Layout.Processing("w1", "gone.csv"))
	if o != nil || !errorsIsNotExist(err) {
		t.Fatalf("a rename of a name gone: %v, %v", o, err)
	}
}

// The attributes RenameAndOpen hands over are the claimed path's own: a
// symbolic link the RENAME moved into place (swapped into ready/ after the
// listing) shows as a link, not as the file it points at, which the OPEN
// followed; the caller refuses it on that (intake's not_regular_file).
func TestRenameAndOpenShowsASymlinkAsALink(t *testing.T) {
	p := partner(t)
	s := dialed(t, p)
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other.csv")
	if err := os.WriteFile(other, []byte("id\n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, filepath.Join(p.SFTP.Root, "ready", "link.csv")); err != nil {
		t.Fatal(err)
	}
	o, err := s.RenameAndOpen(s.Layout.Ready("link.csv"), s.Layout.Processing("w1", "link.csv"))
	if err != nil {
		t.Fatal(err)
	}
	f, st, err := o.Wait()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st.Mode()&os.ModeSymlink == 0 || st.Mode().IsRegular() {
		t.Fatalf("the claimed symlink shows as mode %v: the attributes are its target's", st.Mode())
	}
}

// A server that does not say it is OpenSSH may answer out of order: the
// file is renamed, and none is opened behind the RENAME (the caller opens
// it after).
func TestRenameAndOpenOpensNothingAheadOnOtherServers(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("id\n1\n"), 0o644)
	_, p := inProcessSite(t, root)
	s := dialed(t, p)
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	o, err := s.RenameAndOpen(s.Layout.Ready("a.csv"), s.Layout.Processing("w1", "a.csv"))
	if err != nil || o != nil {
		t.Fatalf("RenameAndOpen on a server of unknown order: %v, %v (want the rename alone)", o, err)
	}
	if _, err := os.Stat(filepath.Join(root, "processing", "w1", "a.csv")); err != nil {
		t.Fatal(err)
	}
}
