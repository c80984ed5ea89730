package sftpconn_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A small file is written whole on the listing channel: its bytes, over
// several WRITEs, and its CLOSE sent together; the file then holds
// exactly what was written (an earlier, longer content truncated), a
// file given up is closed unwritten and left empty, and an OPEN the site
// refuses (a missing directory) is a not-exist error.
func TestWholeFileWritesItsBytesAndClosesAtOnce(t *testing.T) {
	p := partner(t)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	local := func(name string) string { return filepath.Join(p.SFTP.Root, "ready", name) }
	remote := func(name string) string { return s.Layout.ReadyDir() + "/" + name }

	data := bytes.Repeat([]byte("0123456789abcdef"), 10000) // 160 KB: five WRITEs
	if err := os.WriteFile(local("whole"), bytes.Repeat([]byte("x"), len(data)+100), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, body := range [][]byte{data, []byte("{}\n"), nil} {
		w, err := s.CreateWhole(remote("whole"))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteClose(body); err != nil {
			t.Fatalf("%d bytes: %v", len(body), err)
		}
		got, err := os.ReadFile(local("whole"))
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("the file holds %d bytes (%v), want the %d written", len(got), err, len(body))
		}
	}

	w, err := s.CreateWhole(remote("given-up"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(local("given-up")); err != nil || fi.Size() != 0 {
		t.Fatalf("a file given up: %v, %v; want it empty", fi, err)
	}

	if _, err := s.CreateWhole(s.Layout.ReadyDir() + "/missing/x"); !sftpconn.IsNotExist(err) {
		t.Fatalf("an OPEN in a missing directory: %v, want not-exist", err)
	}
	// the channel goes on after a refused OPEN
	if _, err := s.ReadDir(s.Layout.ReadyDir()); err != nil {
		t.Fatalf("listing after a refused OPEN: %v", err)
	}
}

// A WholeFile whose listing channel is dropped before its bytes go out
// (by the session, after a reply that broke it) or ends under it (the
// site closed it) fails with the channel's own error
// (Session.ListingChannelLost: the caller writes through pkg/sftp
// instead), and the next WholeFile opens on a fresh channel and is
// written whole. One whose session was closed fails with the session's
// error, not the channel's: pkg/sftp could not do better.
func TestWholeFileOnALostChannelSaysSo(t *testing.T) {
	for _, c := range []struct {
		name    string
		lose    func(*sftpconn.Session)
		channel bool // the channel's own failure, and the session goes on
	}{
		{"dropped", sftpconn.DropListingChannel, true},
		{"ended", sftpconn.EndListingChannel, true},
		{"closed with the session", func(s *sftpconn.Session) { s.Close() }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := partner(t)
			s, err := sftpconn.Dial(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			name := s.Layout.ReadyDir() + "/lost"
			w, err := s.CreateWhole(name)
			if err != nil {
				t.Fatal(err)
			}
			c.lose(s)
			err = w.WriteClose([]byte("lost"))
			if err == nil || s.ListingChannelLost(err) != c.channel {
				t.Fatalf("a write after the listing channel was %s: %v, want the channel's own error: %v", c.name, err, c.channel)
			}
			if !c.channel {
				return
			}
			w, err = s.CreateWhole(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteClose([]byte("kept")); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(p.SFTP.Root, "ready", "lost")); err != nil || string(got) != "kept" {
				t.Fatalf("the file holds %q (%v), want %q", got, err, "kept")
			}
		})
	}
}
