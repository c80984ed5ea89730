package sftpconn_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// EnsureDirsAtOnce makes nested directories that do not exist yet, and
// reports those and the ones that exist; a name taken by a regular file is
// not reported as made sure of (Prepare then makes sure of it one by one
// and fails).
func TestEnsureDirsAtOnceMakesNestedDirectories(t *testing.T) {
	p := partner(t)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	root := p.SFTP.Root
	if err := os.WriteFile(filepath.Join(root, "taken"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	have := s.EnsureDirsAtOnce(root, []string{"ready", "a/b/c", "a/d", "taken", "../outside"})
	for _, d := range []string{"ready", "a/b/c", "a/d"} {
		full := filepath.Join(root, d)
		if !have[full] {
			t.Errorf("%s not reported made sure of: %v", d, have)
		}
		if st, err := os.Stat(full); err != nil || !st.IsDir() {
			t.Errorf("%s is not a directory on the site: %v", d, err)
		}
	}
	if have[filepath.Join(root, "taken")] || len(have) != 3 {
		t.Errorf("reported %v, want ready, a/b/c and a/d only", have)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "outside")); !os.IsNotExist(err) {
		t.Errorf("a directory outside the root was made: %v", err)
	}
	// the listing channel is still usable after the batch
	n := 0
	if err := s.ListDir(context.Background(), filepath.Join(root, "a"), func(os.FileInfo) error { n++; return nil }); err != nil || n != 2 {
		t.Fatalf("listing after the batch: %v, %d entries (want 2)", err, n)
	}
	// Prepare: the layout's directories, one of them taken by a file
	p.Dirs.Quarantine = "taken"
	s2, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.Prepare("w1", true); err != nil {
		t.Fatalf("Prepare waited for the site's answers: %v", err)
	}
	perr := s2.Prepared()
	if perr == nil {
		t.Fatal("Prepare made sure of a quarantine dir that is a regular file")
	}
	// every write waits for the preparation and fails with its reason,
	// and the session is given up at the next poll
	if err := s2.Rename(s2.Layout.Ready("x"), s2.Layout.Processing("w1", "x")); err == nil || err.Error() != perr.Error() {
		t.Errorf("a rename on a session whose preparation failed: %v, want %v", err, perr)
	}
	if _, err := s2.CreateWhole(path.Join(s2.Layout.ReportsDir(), "x")); err == nil || err.Error() != perr.Error() {
		t.Errorf("a receipt on a session whose preparation failed: %v, want %v", err, perr)
	}
	if !s2.Stale() {
		t.Error("a session whose preparation failed is not stale")
	}
	// the site's failure, told apart from a file's: no caller asking
	// IsNotExist of a rename takes it for a lost claim
	if !errors.Is(perr, sftpconn.ErrNotPrepared) || sftpconn.IsNotExist(perr) || sftpconn.IsPermission(perr) {
		t.Errorf("the preparation's error %v: want ErrNotPrepared, neither not-exist nor permission", perr)
	}
	p.Dirs.Quarantine = "quarantine"
	s3, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if err := s3.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	if err := s3.Prepared(); err != nil {
		t.Fatal(err)
	}
	if s3.Stale() {
		t.Error("a prepared session is stale")
	}
	for _, d := range []string{"processing/w1", "quarantine", "reports", "archive"} {
		if st, err := os.Stat(filepath.Join(root, d)); err != nil || !st.IsDir() {
			t.Errorf("Prepare did not make %s: %v", d, err)
		}
	}
}

// A site that allows one channel per connection (sshd's MaxSessions 1)
// refuses the listing channel Dial opens beside the main one, never the
// main one: the session dials, prepares its directories through pkg/sftp,
// lists whole listings and reads on one channel.
func TestASiteWithOneChannelIsServedOnIt(t *testing.T) {
	srv, err := sshdtest.StartOneChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	root, err := srv.PartnerRoot("one")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("id\n1\n"), 0o644)
	p := partner(t)
	p.SFTP.Address, p.SFTP.User, p.SFTP.PrivateKeyFile, p.SFTP.KnownHostsFile, p.SFTP.Root = srv.Addr, srv.User, srv.ClientKeyFile, srv.KnownHostsFile, root
	for i := 0; i < 3; i++ { // dial after dial: the main channel is never the one refused
		s := dialPreparedListing(t, p, "a.csv")
		if s.Ranges() != nil {
			t.Fatal("a second channel opened on a site that allows one")
		}
		if st, err := s.Stat(s.Layout.ProcessingDir("w1")); err != nil || !st.IsDir() {
			t.Fatalf("processing dir: %v", err)
		}
		s.Close()
	}
}

// A site that starts one sftp subsystem a connection gives it to whichever
// of the two channels' requests, sent together, it takes first: when that
// is the listing channel's, the dial is made again with the main channel
// alone, and so are the site's later dials (listings through pkg/sftp).
// Every dial works: it prepares, lists and reads; and at most one was
// made again.
func TestASiteWithOneSubsystemIsServedWhicheverChannelGotIt(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("id\n1\n"), 0o644)
	srv, p := inProcessSite(t, root)
	srv.OneSubsystemPerConnection()
	before := sftpconn.OneSubsystemFallbacks()
	const dials = 30
	for range dials {
		s := dialPreparedListing(t, p, "a.csv")
		f, err := s.Open(s.Layout.Ready("a.csv"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(b) != "id\n1\n" {
			t.Fatalf("read %q: %v", b, err)
		}
		s.Close()
	}
	if again := sftpconn.OneSubsystemFallbacks() - before; again > 1 {
		t.Fatalf("%d of %d dials made again: the site's later dials should open the main channel alone", again, dials)
	} else {
		t.Logf("%d of %d dials made again", again, dials)
	}
}

// dialPreparedListing dials p, prepares the session's directories and
// checks that ready/ lists as want alone.
func dialPreparedListing(t *testing.T, p *partners.Config, want string) *sftpconn.Session {
	t.Helper()
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Prepare("w1", true); err != nil {
		s.Close()
		t.Fatal(err)
	}
	var names []string
	if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(fi os.FileInfo) error { names = append(names, fi.Name()); return nil }); err != nil {
		s.Close()
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != want {
		s.Close()
		t.Fatalf("listed %v, want %s", names, want)
	}
	return s
}

// A server that leaves global requests unanswered (the keepalive Prepare
// measures the round trip with) does not hold Prepare, nor the writes
// that wait for it, past an op timeout: the session works on with its
// round trip unmeasured. Before, Prepare waited for the reply for good
// while other sessions' traffic kept the connection's own keepalive
// from ever closing it.
func TestPrepareDoesNotWaitForAnUnansweredRoundTrip(t *testing.T) {
	root := t.TempDir()
	srv, p := inProcessSite(t, root)
	srv.MuteGlobalRequests()
	p.SFTP.OpTimeout, p.SFTP.Keepalive = 300*time.Millisecond, time.Hour
	for _, ensure := range []bool{false, true} {
		if err := os.WriteFile(filepath.Join(root, "a"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := sftpconn.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			err := s.Prepare("w1", ensure)
			if err == nil {
				err = s.Rename(path.Join(s.Layout.Root, "a"), path.Join(s.Layout.Root, "b"))
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("ensure %v: %v", ensure, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("ensure %v: Prepare still waits for the round trip's reply", ensure)
		}
		if s.RTT() != 0 {
			t.Fatalf("ensure %v: round trip %v, want unmeasured", ensure, s.RTT())
		}
		s.Close()
		if err := os.Remove(filepath.Join(root, "b")); err != nil {
			t.Fatalf("ensure %v: the rename did not happen: %v", ensure, err)
		}
	}
}
