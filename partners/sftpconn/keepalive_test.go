package sftpconn_test

import (
	"context"
	"io"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A reply on either channel counts as the keepalive's proof of life (a
// session polled more often than its keepalive interval sends none); a
// request alone does not.
func TestARepliedRequestStandsInForAKeepalive(t *testing.T) {
	p := partner(t)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := time.Now()
	if sftpconn.HeardSince(s, before) {
		t.Fatal("heard from the site before anything was asked")
	}
	if _, err := s.Stat(s.Layout.ReadyDir()); err != nil {
		t.Fatal(err)
	}
	if !sftpconn.HeardSince(s, before) {
		t.Fatal("a STAT's reply did not count")
	}
	mid := time.Now()
	if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(_ os.FileInfo) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !sftpconn.HeardSince(s, mid) {
		t.Fatal("a listing's reply did not count")
	}
}

// The site's requests on its session channels (OpenSSH's
// ClientAliveInterval sends keepalive@openssh.com on one) are read, on
// every channel of a connection two partners share, in numbers
// x/crypto/ssh would hold unread before it stops the connection, and one
// that wants a reply gets it; the sessions then list and read as usual.
func TestTheSitesChannelRequestsAreAnswered(t *testing.T) {
	root := t.TempDir()
	for _, id := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(root, id, "ready"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, id, "ready", "f.csv"), []byte("id\n1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv, p := inProcessSite(t, root)
	srv.ChannelKeepalives(40)
	p.SFTP.OpTimeout = 20 * time.Second
	pool := sftpconn.NewConns(3)
	for _, id := range []string{"a", "b"} {
		q := *p
		q.ID, q.SFTP.Root = id, "/"+id
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := pool.Dial(ctx, &q)
		cancel()
		if err != nil {
			t.Fatalf("partner %s: %v", id, err)
		}
		defer s.Close()
		var names []string
		if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(fi os.FileInfo) error {
			names = append(names, fi.Name())
			return nil
		}); err != nil || len(names) != 1 || names[0] != "f.csv" {
			t.Fatalf("partner %s: listed %v: %v", id, names, err)
		}
		name := path.Join(s.Layout.ReadyDir(), "f.csv")
		b, err := s.ReadWhole(name, 1<<10) // the listing channel
		if err != nil || string(b) != "id\n1\n" {
			t.Fatalf("partner %s: read %q: %v", id, b, err)
		}
		f, err := s.Open(name) // pkg/sftp's channel
		if err != nil {
			t.Fatalf("partner %s: %v", id, err)
		}
		b, err = io.ReadAll(f)
		f.Close()
		if err != nil || string(b) != "id\n1\n" {
			t.Fatalf("partner %s: read %q: %v", id, b, err)
		}
	}
	if n := pool.Open(); n != 1 {
		t.Fatalf("%d connections open, want the one both partners share", n)
	}
}
