package sftpconn_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
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
	check := func(t *testing.T, s *sftpconn.Session, dir string) {
		want, err := s.Client.ReadDir(dir) // pkg/sftp's
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
		whole, err := s.ReadDir(dir) // the session's, on the listing channel
		if err != nil || fmt.Sprint(describe(whole)) != fmt.Sprint(w) {
			t.Fatalf("Session.ReadDir: %v, %d entries, want %d", err, len(whole), len(w))
		}
		stop := fmt.Errorf("enough")
		n := 0
		if err := s.ListDir(context.Background(), dir, func(os.FileInfo) error { n++; return map[bool]error{true: stop}[n == 10] }); err == nil || n != 10 {
			t.Fatalf("a stopped listing: %v after %d entries", err, n)
		}
		if err := s.ListDir(context.Background(), dir+"/missing", func(os.FileInfo) error { return nil }); !os.IsNotExist(err) && !errorsIsNotExist(err) {
			t.Fatalf("a missing directory: %v", err)
		}
		// an empty directory (both READDIRs in flight find the end: no
		// third is sent after a reply of "." and ".." alone), then the
		// whole one again on the same channel
		n = 0
		before := sftpconn.ListingRequests(s)
		if err := s.ListDir(context.Background(), dir+"/sub", func(os.FileInfo) error { n++; return nil }); err != nil || n != 0 {
			t.Fatalf("an empty directory: %v, %d entries", err, n)
		}
		if sent := sftpconn.ListingRequests(s) - before; sent != 4 {
			t.Fatalf("an empty directory's listing sent %d requests, want 4 (OPENDIR, two READDIRs, CLOSE)", sent)
		}
		got = got[:0]
		if err := s.ListDir(context.Background(), dir, func(fi os.FileInfo) error { got = append(got, fi); return nil }); err != nil || len(got) != len(w) {
			t.Fatalf("listed again: %v, %d entries, want %d", err, len(got), len(w))
		}
	}
	t.Run("openssh", func(t *testing.T) {
		p := partner(t)
		fill(t, filepath.Join(p.SFTP.Root, "ready"))
		s, err := sftpconn.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s, s.Layout.ReadyDir())
	})
	t.Run("in-process", func(t *testing.T) {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "ready"), 0o755)
		fill(t, filepath.Join(root, "ready"))
		_, p := inProcessSite(t, root)
		s, err := sftpconn.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, s, s.Layout.ReadyDir())
	})
}

// A site that sends "." and ".." in a reply of their own before the
// directory's names (the listing then keeps one READDIR in flight, not
// two) is listed whole.
func TestAListingWhoseDotsComeApartIsWhole(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(root, "ready", fmt.Sprintf("f%d.csv", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv, p := inProcessSite(t, root)
	srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
		if method != "List" || path.Base(dir) != "ready" {
			return sftpd.Entries(truth)
		}
		return dotsApart(truth)
	})
	defer srv.Lie(nil)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(fi os.FileInfo) error { got = append(got, fi.Name()); return nil }); err != nil {
		t.Fatal(err)
	}
	if sort.Strings(got); fmt.Sprint(got) != "[f0.csv f1.csv f2.csv f3.csv f4.csv]" {
		t.Fatalf("listed %v, want the five files", got)
	}
}

// dotsApart answers a listing with "." and ".." alone, then the
// directory's entries.
type dotsApart []os.FileInfo

func (e dotsApart) ListAt(ls []os.FileInfo, off int64) (int, error) {
	if off == 0 {
		return copy(ls, []os.FileInfo{fakeInfo{name: ".", mode: os.ModeDir | 0o755}, fakeInfo{name: "..", mode: os.ModeDir | 0o755}}), nil
	}
	return sftpd.Entries(e).ListAt(ls, off-2)
}

// Listings side by side share the listing channel (each request has its
// id, one reader hands out the replies): each gets its own directory
// whole, one stopped early beside them changes nothing, a missing
// directory fails only its own listing, and the channel serves listings
// after them.
func TestListingsSideBySideEachGetTheirOwn(t *testing.T) {
	p := partner(t)
	want := map[string][]string{}
	for i := range 6 {
		dir := filepath.Join(p.SFTP.Root, "ready", fmt.Sprintf("d%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var names []string
		for j := range 400*i + 1 { // up to 2001 entries: several READDIR replies
			name := fmt.Sprintf("f-%d-%04d.csv", i, j)
			if err := os.WriteFile(filepath.Join(dir, name), make([]byte, j%5), 0o644); err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		sort.Strings(names)
		want[fmt.Sprintf("d%d", i)] = names
	}
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for round := range 3 {
		errs := make(chan error, 16)
		for d, names := range want {
			go func() {
				ents, err := s.ReadDir(s.Layout.ReadyDir() + "/" + d)
				var got []string
				for _, e := range ents {
					got = append(got, e.Name())
				}
				sort.Strings(got)
				if err == nil && fmt.Sprint(got) != fmt.Sprint(names) {
					err = fmt.Errorf("%s: %d entries, want %d", d, len(got), len(names))
				}
				errs <- err
			}()
		}
		go func() { // stopped after 3 entries
			n := 0
			stop := errors.New("enough")
			err := s.ListDir(context.Background(), s.Layout.ReadyDir()+"/d5", func(os.FileInfo) error {
				if n++; n == 3 {
					return stop
				}
				return nil
			})
			if !errors.Is(err, stop) || n != 3 {
				err = fmt.Errorf("a stopped listing: %v after %d entries", err, n)
			} else {
				err = nil
			}
			errs <- err
		}()
		go func() {
			_, err := s.ReadDir(s.Layout.ReadyDir() + "/missing")
			if !sftpconn.IsNotExist(err) {
				errs <- fmt.Errorf("a missing directory: %v", err)
				return
			}
			errs <- nil
		}()
		for range len(want) + 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	// a listing whose ctx ends stops alone: one beside it on the same
	// channel still gets its directory whole
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	beside := make(chan error, 1)
	var once sync.Once
	err = s.ListDir(ctx, s.Layout.ReadyDir()+"/d5", func(os.FileInfo) error {
		once.Do(func() {
			sent := sftpconn.ListingRequests(s)
			go func() {
				ents, err := s.ReadDir(s.Layout.ReadyDir() + "/d4")
				if err == nil && len(ents) != len(want["d4"]) {
					err = fmt.Errorf("%d entries, want %d", len(ents), len(want["d4"]))
				}
				beside <- err
			}()
			// the listing beside is on the channel (its OPENDIR and first
			// READDIRs sent; this listing sends nothing while fn runs)
			testenv.WaitFor(t, 30*time.Second, func() bool { return sftpconn.ListingRequests(s) >= sent+3 },
				testenv.Says("the listing beside never went out"))
			cancel()
		})
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a listing whose ctx ended: %v", err)
	}
	if err := <-beside; err != nil {
		t.Fatalf("a listing beside one whose ctx ended: %v", err)
	}
	ents, err := s.ReadDir(s.Layout.ReadyDir())
	if err != nil || len(ents) != len(want) {
		t.Fatalf("listed after: %v, %d entries, want %d", err, len(ents), len(want))
	}
}

// inProcessSite serves root as / over pkg/sftp's request server
// (internal/sftpd) for the partner it returns; the server stops with t.
func inProcessSite(t *testing.T, root string) (*sftpd.Server, *partners.Config) {
	t.Helper()
	srv, sftp := testenv.InProcessServer(t, root, "p1")
	p := &partners.Config{ID: "p1", SFTP: sftp}
	p.SetDefaults()
	return srv, p
}

func errorsIsNotExist(err error) bool { return sftpconn.IsNotExist(err) }

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
	s, err := sftpconn.Dial(context.Background(), p)
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
		var te *sftpconn.TimeoutError
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &te) {
			t.Fatalf("listing a hung site: %v, want a *sftpconn.TimeoutError", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("listing a hung site did not end")
	}
	if !s.TimedOut() {
		t.Fatal("the session does not say it timed out")
	}
}
