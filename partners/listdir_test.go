package partners_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// fill makes a directory of 3000 files (sizes and mtimes vary), a
// subdirectory and a symlink.
func fill(t *testing.T, dir string) {
	t.Helper()
	for i := range 3000 {
		p := filepath.Join(dir, fmt.Sprintf("f-%04d.csv", i))
		if err := os.WriteFile(p, make([]byte, i%7), 0o644); err != nil {
			t.Fatal(err)
		}
		mt := time.Unix(1_700_000_000+int64(i), 0)
		os.Chtimes(p, mt, mt)
	}
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
}

func describe(fis []os.FileInfo) []string {
	var out []string
	for _, f := range fis {
		out = append(out, fmt.Sprintf("%s %d %s %d regular=%v", f.Name(), f.Size(), f.Mode().Type(), f.ModTime().Unix(), f.Mode().IsRegular()))
	}
	sort.Strings(out)
	return out
}

// ListDir streams the same entries, sizes, types and mtimes as pkg/sftp's
// ReadDir, from OpenSSH and from the in-process server, and stops when
// its callback says so.
func TestListDirStreamsWhatReadDirReturns(t *testing.T) {
	check := func(t *testing.T, s *partners.Session, dir string) {
		want, err := s.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []os.FileInfo
		if err := s.ListDir(context.Background(), dir, func(fi os.FileInfo) error { got = append(got, fi); return nil }); err != nil {
			t.Fatal(err)
		}
		w, g := describe(want), describe(got)
		if len(w) != 3002 || fmt.Sprint(w) != fmt.Sprint(g) {
			t.Fatalf("ListDir gave %d entries, ReadDir %d; first differences: %v / %v", len(g), len(w), g[:3], w[:3])
		}
		stop := fmt.Errorf("enough")
		n := 0
		if err := s.ListDir(context.Background(), dir, func(os.FileInfo) error { n++; return map[bool]error{true: stop}[n == 10] }); err == nil || n != 10 {
			t.Fatalf("a stopped listing: %v after %d entries", err, n)
		}
		if err := s.ListDir(context.Background(), dir+"/missing", func(os.FileInfo) error { return nil }); !os.IsNotExist(err) && !errorsIsNotExist(err) {
			t.Fatalf("a missing directory: %v", err)
		}
		// an empty directory (both READDIRs in flight find the end), then
		// the whole one again on the same channel
		n = 0
		if err := s.ListDir(context.Background(), dir+"/sub", func(os.FileInfo) error { n++; return nil }); err != nil || n != 0 {
			t.Fatalf("an empty directory: %v, %d entries", err, n)
		}
		got = got[:0]
		if err := s.ListDir(context.Background(), dir, func(fi os.FileInfo) error { got = append(got, fi); return nil }); err != nil || len(got) != len(w) {
			t.Fatalf("listed again: %v, %d entries, want %d", err, len(got), len(w))
		}
	}
	t.Run("openssh", func(t *testing.T) {
		p := partner(t)
		fill(t, filepath.Join(p.SFTP.Root, "ready"))
		s, err := partners.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s, s.Layout.ReadyDir())
	})
	t.Run("in-process", func(t *testing.T) {
		_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
		host, _ := ssh.NewSignerFromKey(hostPriv)
		clientKey := filepath.Join(t.TempDir(), "client")
		pub, err := sshdtest.WriteKey(clientKey)
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "ready"), 0o755)
		fill(t, filepath.Join(root, "ready"))
		srv, err := sftpd.Start("127.0.0.1:0", host, []sftpd.User{{Name: "p1", Key: pub, Root: root}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		kh := filepath.Join(t.TempDir(), "kh")
		os.WriteFile(kh, []byte(knownhosts.Line([]string{srv.Addr()}, host.PublicKey())+"\n"), 0o600)
		p := &partners.Config{ID: "p1", SFTP: partners.SFTP{Address: srv.Addr(), User: "p1", PrivateKeyFile: clientKey,
			KnownHostsFile: kh, Root: "/", DialTimeout: 5 * time.Second, Keepalive: time.Minute}}
		p.SetDefaults()
		s, err := partners.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s, s.Layout.ReadyDir())
	})
}

func errorsIsNotExist(err error) bool { return partners.IsNotExist(err) }

// A site that goes silent during a listing: ListDir's own channel is under
// the same per-request deadline as pkg/sftp's (sftp.op_timeout), so the
// listing ends with a deadline error instead of waiting for good.
func TestListDirOfAHungSiteEndsOnTheDeadline(t *testing.T) {
	p := partner(t)
	proxy := testenv.NewProxy(t, p.SFTP.Address)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{proxy.Addr()}, sshd.HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.SFTP.Address, p.SFTP.KnownHostsFile = proxy.Addr(), kh
	p.SFTP.OpTimeout, p.SFTP.Keepalive = 500*time.Millisecond, time.Hour
	fill(t, filepath.Join(p.SFTP.Root, "ready"))
	s, err := partners.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	proxy.Freeze()
	defer proxy.Thaw()
	done := make(chan error, 1)
	go func() {
		done <- s.ListDir(context.Background(), s.Layout.ReadyDir(), func(os.FileInfo) error { return nil })
	}()
	select {
	case err := <-done:
		var te *partners.TimeoutError
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &te) {
			t.Fatalf("listing a hung site: %v, want a *partners.TimeoutError", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("listing a hung site did not end")
	}
	if !s.TimedOut() {
		t.Fatal("the session does not say it timed out")
	}
}
