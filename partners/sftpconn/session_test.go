package sftpconn_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

var sshd *sshdtest.Server

func TestMain(m *testing.M) {
	var err error
	sshd, err = sshdtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	sshd.Close()
	os.Exit(code)
}

func partner(t *testing.T) *partners.Config {
	t.Helper()
	root, err := sshd.PartnerRoot(strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-"))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	p := &partners.Config{ID: "p1", SFTP: partners.SFTP{Address: sshd.Addr, User: sshd.User,
		PrivateKeyFile: sshd.ClientKeyFile, KnownHostsFile: sshd.KnownHostsFile, Root: root},
		Feeds: []partners.Feed{{Name: "f", Pattern: `.*\.csv`, Target: "t", Key: []string{"id"},
			Columns: []partners.Column{{Name: "id", Type: "text", Required: true}}}}}
	p.SetDefaults()
	if err := p.Validate("p"); err != nil {
		t.Fatal(err)
	}
	return p
}

// dialed is a session to p's site, closed when the test ends.
func dialed(t *testing.T, p *partners.Config) *sftpconn.Session {
	t.Helper()
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPinnedHostKeyConnectsToOpenSSH(t *testing.T) {
	p := partner(t)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Stat(s.Layout.ReadyDir()); err != nil {
		t.Fatal(err)
	}
}

func TestHostKeyMismatchIsRefused(t *testing.T) {
	p := partner(t)
	other, err := sshdtest.WriteKey(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(kh, []byte(knownhosts.Line([]string{sshd.Addr}, other)+"\n"), 0o600)
	p.SFTP.KnownHostsFile = kh
	_, err = sftpconn.Dial(context.Background(), p)
	if !sftpconn.IsHostKeyMismatch(err) {
		t.Fatalf("got %v, want a host key mismatch", err)
	}
	for _, w := range []string{"p1", "does not match the pinned", ssh.FingerprintSHA256(sshd.HostKey)} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not say %q", err, w)
		}
	}
}

func TestHostWithoutAPinnedKeyIsRefused(t *testing.T) {
	p := partner(t)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	other, _ := sshdtest.WriteKey(filepath.Join(t.TempDir(), "k"))
	os.WriteFile(kh, []byte(knownhosts.Line([]string{"10.9.9.9:22"}, other)+"\n"), 0o600)
	p.SFTP.KnownHostsFile = kh
	_, err := sftpconn.Dial(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "no entry for") {
		t.Fatalf("got %v, want 'no entry for'", err)
	}
}

func TestProbeAcceptsOpenSSHAndLeavesNothing(t *testing.T) {
	p := partner(t)
	if _, err := sftpconn.Probe(context.Background(), p, "w1"); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(p.SFTP.Root, "processing", "w1"))
	if err != nil || len(ents) != 0 {
		t.Fatalf("probe left %v (%v)", ents, err)
	}
}

// A site that keeps a channel open after intake ended its SFTP (sent
// EOF) does not hold the probe: the channels opened to count them are
// closed without waiting for the site, and the session's end breaks them.
// Before, `intake check` waited for good on the first one's close.
func TestProbeEndsOnASiteThatKeepsItsChannelsOpen(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	srv, p := inProcessSite(t, root)
	srv.LingerChannels()
	done := make(chan error, 1)
	var prof partners.Profile
	go func() {
		var err error
		prof, err = sftpconn.Probe(context.Background(), p, "w1")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the probe still waits for a channel the site keeps open")
	}
	if prof.Channels != partners.MaxChannelsProbe {
		t.Fatalf("%d channels counted, want %d (the in-process server refuses none)", prof.Channels, partners.MaxChannelsProbe)
	}
}

func TestProbeRefusesAMissingReadyDir(t *testing.T) {
	p := partner(t)
	os.Remove(filepath.Join(p.SFTP.Root, "ready"))
	_, err := sftpconn.Probe(context.Background(), p, "w1")
	if err == nil || !strings.Contains(err.Error(), "dirs.ready") {
		t.Fatalf("got %v, want an error naming dirs.ready", err)
	}
}

// The in-process server the demo uses must behave like OpenSSH where the
// protocol relies on it.
func TestInProcessServerRenamesLikeOpenSSH(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	_, p := inProcessSite(t, root)
	if _, err := sftpconn.Probe(context.Background(), p, "w1"); err != nil {
		t.Fatalf("probe: %v", err)
	}
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("a"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(root, "ready", "link.csv"))
	ents, err := s.ReadDir("/ready")
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{}
	for _, e := range ents {
		modes[e.Name()] = e.Mode()
	}
	if !modes["a.csv"].IsRegular() || modes["link.csv"]&os.ModeSymlink == 0 {
		t.Fatalf("listing modes %v: a symlink must be listed as a symlink", modes)
	}
	if err := s.Rename("/ready/a.csv", "/processing/w1/a.csv"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rename("/ready/a.csv", "/processing/w2/a.csv"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("second claim got %v, want not-exist", err)
	}
	if _, err := s.Stat("/../../etc/passwd"); err == nil {
		// confined: /../../etc/passwd resolves inside root
		if _, err := os.Stat(filepath.Join(root, "etc", "passwd")); err != nil {
			t.Fatal("a path escaped the served folder")
		}
	}
}

func TestPacketSizeIsOpenSSHsReadLimitOnlyWhereItIsAnnounced(t *testing.T) {
	for _, c := range []struct {
		configured int
		version    string
		want       int
	}{
		{0, "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3", partners.MaxSFTPPacket},
		{0, "SSH-2.0-OpenSSH_8.6", partners.MaxSFTPPacket},
		{0, "SSH-2.0-OpenSSH_8.5p1", partners.MinSFTPPacket},
		{0, "SSH-2.0-OpenSSH_7.4", partners.MinSFTPPacket},
		{0, "SSH-2.0-OpenSSH_10.0", partners.MaxSFTPPacket},
		{0, "SSH-2.0-AWS_SFTP_1.1", partners.MinSFTPPacket},
		{0, "SSH-2.0-OpenSSH_x", partners.MinSFTPPacket},
		{65536, "SSH-2.0-OpenSSH_9.2p1", 65536},
	} {
		if got := sftpconn.PacketSize(c.configured, c.version); got != c.want {
			t.Errorf("PacketSize(%d, %q) = %d, want %d", c.configured, c.version, got, c.want)
		}
	}
	p := partner(t)
	p.SFTP.MaxPacket = 300 * 1024
	if err := p.Validate("p"); err == nil {
		t.Fatal("a max_packet above OpenSSH's read limit was accepted")
	}
}

// A file of many 255 KiB requests (and a ragged tail) arrives whole from
// the real OpenSSH server with the packet size auto picks.
func TestLargeDownloadFromOpenSSHIsWhole(t *testing.T) {
	p := partner(t)
	data := make([]byte, 5<<20+12345)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(p.SFTP.Root, "ready", "big.bin")
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, err := s.Open(s.Layout.Ready("big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got strings.Builder
	n, err := f.WriteTo(&got)
	if err != nil || n != int64(len(data)) || got.String() != string(data) {
		t.Fatalf("downloaded %d of %d bytes (equal %v), err %v", n, len(data), got.String() == string(data), err)
	}
}

// Prepare makes sure of every directory intake writes to, asking about
// them together (nested ones beside their parents: processing/<worker>
// beside a missing processing/), and a listing sent right behind it,
// before its answers came, sees them made (OpenSSH answers in order).
func TestPrepareCreatesTheDirectoriesTogether(t *testing.T) {
	p := partner(t)
	if err := os.RemoveAll(filepath.Join(p.SFTP.Root, "ready")); err != nil {
		t.Fatal(err)
	}
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.ListDir(context.Background(), s.Layout.ProcessingDir("w1"), func(os.FileInfo) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("listing processing/w1 right behind Prepare: %d entries, %v", n, err)
	}
	if err := s.Prepared(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{p.Dirs.Ready, filepath.Join(p.Dirs.Processing, "w1"), p.Dirs.Quarantine, p.Dirs.Reports, p.Dirs.Archive} {
		if fi, err := os.Stat(filepath.Join(p.SFTP.Root, d)); err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v", d, err)
		}
	}
	// again, on a site where they exist: the MKDIRs fail and change
	// nothing, no error
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Prepared(); err != nil {
		t.Fatal(err)
	}
}

// Prepare does not wait for the site's answers, and a write does: with
// the site holding its answers to STATs, Prepare returns, a rename waits,
// and goes through once the answers come.
func TestPrepareReturnsBeforeTheSiteAnswersAndWritesWait(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("id\n1\n"), 0o644)
	srv, p := inProcessSite(t, root)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	release := make(chan struct{})
	srv.Lie(func(method, _ string, truth []os.FileInfo) sftp.ListerAt {
		if method == "Stat" {
			<-release
		}
		return sftpd.Entries(truth)
	})
	prepared := make(chan error, 1)
	go func() { prepared <- s.Prepare("w1", true) }()
	select {
	case err := <-prepared:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		close(release)
		t.Fatal("Prepare waited for the site's answers")
	}
	renamed := make(chan error, 1)
	go func() { renamed <- s.Rename(s.Layout.Ready("a.csv"), s.Layout.Processing("w1", "a.csv")) }()
	select {
	case err := <-renamed:
		close(release)
		t.Fatalf("a rename went out before the preparation ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	srv.Lie(nil)
	if err := <-renamed; err != nil {
		t.Fatalf("rename after the preparation: %v", err)
	}
	if err := s.Prepared(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "processing", "w1", "a.csv")); err != nil {
		t.Fatal(err)
	}
}
