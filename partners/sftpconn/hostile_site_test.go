package sftpconn_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// fakeInfo is an entry a lying server lists.
type fakeInfo struct {
	name string
	size int64
	mode os.FileMode
}

func (f fakeInfo) Name() string       { return f.name }
func (f fakeInfo) Size() int64        { return f.size }
func (f fakeInfo) Mode() os.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Unix(1_700_000_000, 0) }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return nil }

// entries answers a listing with ents, then the end.
// endless answers a listing with names for ever, never the end.
type endless func(i int64) string

func (e endless) ListAt(ls []os.FileInfo, off int64) (int, error) {
	for i := range ls {
		ls[i] = fakeInfo{name: e(off + int64(i)), size: 1, mode: 0o644}
	}
	return len(ls), nil
}

// A server's listing is not trusted to name entries of one directory: a
// name with '/' ("/" itself, "a/../b"), an empty one or one with NUL is
// left out and counted, never passed on (intake once moved ready/ itself
// for a listed "/", which path.Base kept as "/"), as is a name longer than
// MaxNameBytes (no file system keeps one); "." and ".." are left
// out as before; an entry whose size no file has (2^63 bytes or more) is
// irregular, never a regular file of negative size. Both whole and
// streamed listings, on the listing channel and through pkg/sftp (a site
// that allows one channel).
func TestAListingsImpossibleNamesAndSizesAreLeftOut(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "good.csv"), []byte("id\n1\n"), 0o644)
	srv, p := inProcessSite(t, root)
	srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
		if method != "List" {
			return sftpd.Entries(truth)
		}
		return append(sftpd.Entries{
			fakeInfo{name: ".", mode: os.ModeDir | 0o755},
			fakeInfo{name: "/", size: 10, mode: 0o644},
			fakeInfo{name: "a/../b.csv", size: 10, mode: 0o644},
			fakeInfo{name: "", size: 10, mode: 0o644},
			fakeInfo{name: "nul\x00.csv", size: 10, mode: 0o644},
			fakeInfo{name: "huge.csv", size: -2, mode: 0o644}, // 2^64-2 on the wire
			fakeInfo{name: strings.Repeat("n", sftpconn.MaxNameBytes) + ".csv", size: 10, mode: 0o644},
			fakeInfo{name: "..", mode: os.ModeDir | 0o755},
		}, truth...)
	})
	for _, one := range []bool{false, true} {
		t.Run(fmt.Sprintf("one channel %v", one), func(t *testing.T) {
			if one {
				srv.OneSubsystemPerConnection()
			}
			s := dialed(t, p)
			if sftpconn.ListsOnItsOwnChannel(s) == one {
				t.Fatalf("listing channel %v, want %v", sftpconn.ListsOnItsOwnChannel(s), !one)
			}
			var streamed []os.FileInfo
			if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(e os.FileInfo) error {
				streamed = append(streamed, e)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			whole, err := s.ReadDir(s.Layout.ReadyDir())
			if err != nil {
				t.Fatal(err)
			}
			// pkg/sftp hands on path.Base of each name: "a/../b.csv"
			// arrives as "b.csv" there, which no check can tell from a
			// true name; the rest is refused alike
			want := []string{"good.csv regular 5", "huge.csv irregular 0"}
			wantImpossible := int64(2 * 5)
			if one {
				want = []string{"b.csv regular 10", "good.csv regular 5", "huge.csv irregular 0"}
				wantImpossible = 2 * 4 // "/", "" (which pkg/sftp makes "."), the NUL and the long name
			}
			for _, got := range [][]os.FileInfo{streamed, whole} {
				var names []string
				for _, e := range got {
					kind := "irregular"
					if e.Mode().IsRegular() {
						kind = "regular"
					}
					names = append(names, fmt.Sprintf("%s %s %d", e.Name(), kind, e.Size()))
				}
				sort.Strings(names)
				if strings.Join(names, "|") != strings.Join(want, "|") {
					t.Fatalf("listed %q, want %q", names, want)
				}
			}
			if n := s.TakeImpossibleNames(); n != wantImpossible {
				t.Fatalf("%d impossible names counted, want %d", n, wantImpossible)
			}
			if n := s.TakeImpossibleNames(); n != 0 {
				t.Fatalf("%d impossible names after they were taken", n)
			}
		})
	}
}

// A listing that would never end fails rather than holding the poll (its
// replies keep the watchdog, which measures silence, from firing): "." or
// ".." listed again at once, more names than any directory holds after
// MaxListNames; a listing read whole fails past MaxReadDirEntries.
func TestAListingThatNeverEndsFails(t *testing.T) {
	defer sftpconn.SetListLimits(5000, 300)()
	srv, p := inProcessSite(t, readyOf(t, 400))
	s := dialed(t, p)
	count := func() (int, error) {
		n := 0
		err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(os.FileInfo) error { n++; return nil })
		return n, err
	}
	if n, err := count(); err != nil || n != 400 {
		t.Fatalf("a true listing: %d entries, %v", n, err)
	}
	if _, err := s.ReadDir(s.Layout.ReadyDir()); !errors.Is(err, sftpconn.ErrEndlessListing) || !strings.Contains(err.Error(), "more than 300 entries") {
		t.Fatalf("a listing read whole past its limit: %v", err)
	}
	for _, c := range []struct {
		name  string
		lie   endless
		wantN int // entries passed on before the listing failed
		want  string
	}{
		{"dot for ever", func(int64) string { return "." }, 0, `"." listed again`},
		{"dot-dot for ever", func(int64) string { return ".." }, 0, `".." listed again`},
		{"new names for ever", func(i int64) string { return fmt.Sprintf("n%d.csv", i) }, 5000, "more than 5000 names"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
				if method == "List" {
					return c.lie
				}
				return sftpd.Entries(truth)
			})
			defer srv.Lie(nil)
			done := make(chan error, 1)
			var n int
			go func() {
				var err error
				n, err = count()
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, sftpconn.ErrEndlessListing) || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want %s", err, c.want)
				}
				if n != c.wantN {
					t.Fatalf("%d entries passed on, want %d", n, c.wantN)
				}
			case <-time.After(time.Minute):
				t.Fatal("the listing did not end")
			}
		})
	}
	// the session and its listing channel go on
	if n, err := count(); err != nil || n != 400 {
		t.Fatalf("a true listing after the endless ones: %d entries, %v", n, err)
	}
}

// A stat whose size no file has (2^63 bytes or more: pkg/sftp passes it on
// as negative) is refused: no negative size reaches a limit's comparison
// or a buffer's length (intake made a slice of it once).
func TestAStatOfAnImpossibleSizeIsRefused(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	os.WriteFile(filepath.Join(root, "ready", "a.csv"), []byte("x"), 0o644)
	srv, p := inProcessSite(t, root)
	s := dialed(t, p)
	f := s.Layout.Ready("a.csv")
	if fi, err := s.Stat(f); err != nil || fi.Size() != 1 {
		t.Fatalf("a true stat: %v %v", fi, err)
	}
	srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
		if method == "List" {
			return sftpd.Entries(truth)
		}
		return sftpd.Entries{fakeInfo{name: "a.csv", size: -2, mode: 0o644}}
	})
	if _, err := s.Stat(f); !errors.Is(err, sftpconn.ErrImpossibleSize) {
		t.Fatalf("stat: %v, want ErrImpossibleSize", err)
	}
	if _, err := s.Lstat(f); !errors.Is(err, sftpconn.ErrImpossibleSize) {
		t.Fatalf("lstat: %v, want ErrImpossibleSize", err)
	}
}

// A site whose sshd stops starting channels (it leaves a channel's open,
// or its subsystem request, unanswered, and answers keepalives all the
// while) ends the session on the op timeout rather than holding the call
// for good: a listing channel opened again, a second channel for ranges,
// and a session joining a connection another partner's session keeps.
func TestAChannelTheSiteNeverStartsEndsTheSession(t *testing.T) {
	const opTimeout = 400 * time.Millisecond
	within := func(t *testing.T, what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		start := time.Now()
		go func() { defer close(done); f() }()
		select {
		case <-done:
			if took := time.Since(start); took < opTimeout/2 {
				t.Fatalf("%s ended after %s, before the op timeout", what, took)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s did not end", what)
		}
	}
	for _, hang := range []int{sftpd.HangOpen, sftpd.HangSubsystem, sftpd.HangInit} {
		t.Run(fmt.Sprintf("hang %d", hang), func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "a", "ready"), 0o755)
			os.MkdirAll(filepath.Join(root, "b", "ready"), 0o755)
			srv, p := inProcessSite(t, root)
			p.SFTP.OpTimeout, p.SFTP.DialTimeout = opTimeout, 2*time.Second
			dial := func() *sftpconn.Session {
				s, err := sftpconn.Dial(context.Background(), p)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			lister, ranges := dial(), dial()
			srv.HangChannels(hang)
			defer srv.HangChannels(sftpd.HangNothing)

			sftpconn.DropListingChannel(lister)
			within(t, "a listing on a channel opened again", func() {
				err := lister.ListDir(context.Background(), lister.Layout.ReadyDir(), func(os.FileInfo) error { return nil })
				var te *sftpconn.TimeoutError
				if !errors.As(err, &te) || !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("listing: %v, want a *sftpconn.TimeoutError", err)
				}
			})
			if !lister.TimedOut() || !lister.Stale() {
				t.Fatal("the session does not say it timed out and is stale")
			}

			within(t, "a second channel for ranges", func() {
				if c := ranges.Ranges(); c != nil {
					t.Error("a channel the site never started was handed on")
				}
			})
			if !ranges.TimedOut() {
				t.Fatal("the session does not say it timed out")
			}

			// two partners on one account: the second joins the first's
			// connection, whose channels the site no longer starts
			srv.HangChannels(sftpd.HangNothing)
			pool := sftpconn.NewConns(3)
			first, joiner := *p, *p
			first.ID, first.SFTP.Root = "a", "/a"
			joiner.ID, joiner.SFTP.Root = "b", "/b"
			fs, err := pool.Dial(context.Background(), &first)
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()
			srv.HangChannels(hang)
			within(t, "a session joining the connection", func() {
				js, err := pool.Dial(context.Background(), &joiner)
				if err == nil {
					js.Close()
					t.Error("a session the site never started was handed on")
				} else if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("joining: %v, want a deadline error", err)
				}
			})
		})
	}
}

// noNames answers every READDIR with a NAME reply of no name.
type noNames struct{}

func (noNames) ListAt([]os.FileInfo, int64) (int, error) { return 0, nil }

// readyOf is a site's root whose ready/ holds n empty files.
func readyOf(t *testing.T, n int) string {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ready"), 0o755)
	for i := range n {
		os.WriteFile(filepath.Join(root, "ready", fmt.Sprintf("f%03d.csv", i)), nil, 0o644)
	}
	return root
}

// On a site that allows one SFTP channel a listing goes through pkg/sftp,
// which reads it whole into memory: a site that lists for ever would grow
// it until the daemon died. The names its replies announce are counted
// as they come and the listing ends past its bound (a streamed listing's,
// MaxListNames; a directory read whole's, MaxReadDirEntries), with
// ErrEndlessListing and nothing passed on; the session goes on. A NAME
// reply of no name ends it at once (pkg/sftp asked again after each, for
// good). Two listings side by side do not count each other's names.
func TestAWholeListingOnAOneChannelSiteIsBounded(t *testing.T) {
	defer sftpconn.SetListLimits(5000, 300)()
	srv, p := inProcessSite(t, readyOf(t, 200))
	srv.OneSubsystemPerConnection()
	var s *sftpconn.Session
	for range 2 { // the first dial may learn the site's one subsystem
		s = dialed(t, p)
	}
	if sftpconn.ListsOnItsOwnChannel(s) {
		t.Fatal("the session lists on a channel of its own; the test wants a one-channel site")
	}
	count := func() (int, error) {
		n := 0
		err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(os.FileInfo) error { n++; return nil })
		return n, err
	}
	if n, err := count(); err != nil || n != 200 {
		t.Fatalf("a true listing: %d entries, %v", n, err)
	}
	srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
		if method == "List" {
			return endless(func(i int64) string { return fmt.Sprintf("n%d.csv", i) })
		}
		return sftpd.Entries(truth)
	})
	for _, whole := range []bool{false, true} {
		done := make(chan error, 1)
		var n int
		go func() {
			var err error
			if whole {
				_, err = s.ReadDir(s.Layout.ReadyDir())
			} else {
				n, err = count()
			}
			done <- err
		}()
		want := "more than 5000 names"
		if whole {
			want = "more than 300 names"
		}
		select {
		case err := <-done:
			if !errors.Is(err, sftpconn.ErrEndlessListing) || !strings.Contains(err.Error(), want) {
				t.Fatalf("an endless listing through pkg/sftp (whole %v): %v, want %s", whole, err, want)
			}
			if n != 0 {
				t.Fatalf("%d entries passed on from a listing that did not end", n)
			}
		case <-time.After(time.Minute):
			t.Fatal("the listing did not end")
		}
	}
	// a site that answers every READDIR with a NAME reply of no name
	// (pkg/sftp asks again after each; every reply renews the watchdog)
	srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
		if method == "List" {
			return noNames{}
		}
		return sftpd.Entries(truth)
	})
	for _, whole := range []bool{false, true} {
		done := make(chan error, 1)
		go func() {
			var err error
			if whole {
				_, err = s.ReadDir(s.Layout.ReadyDir())
			} else {
				_, err = count()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, sftpconn.ErrEndlessListing) || !strings.Contains(err.Error(), "a reply of none") {
				t.Fatalf("NAME replies of no name for ever (whole %v): %v, want ErrEndlessListing", whole, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("NAME replies of no name for ever (whole %v): the listing did not end", whole)
		}
	}
	// names within every count, over the bytes a whole listing may hold
	defer sftpconn.SetWholeListingBytes(256 << 10)()
	var many sftpd.Entries
	for i := range 1000 {
		many = append(many, fakeInfo{name: fmt.Sprintf("%s%d.csv", strings.Repeat("l", 500), i), size: 1, mode: 0o644})
	}
	srv.Lie(func(method, dir string, truth []os.FileInfo) sftp.ListerAt {
		if method == "List" {
			return many
		}
		return sftpd.Entries(truth)
	})
	if _, err := count(); !errors.Is(err, sftpconn.ErrEndlessListing) || !strings.Contains(err.Error(), "bytes of them") {
		t.Fatalf("1000 names of 500 bytes past 256 KiB listed whole: %v, want ErrEndlessListing", err)
	}
	srv.Lie(nil)
	if n, err := count(); err != nil || n != 200 {
		t.Fatalf("a true listing after the endless ones: %d entries, %v", n, err)
	}
	// two directories of 200 read whole side by side: 400 names on the
	// channel, each listing within its 300
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := s.ReadDir(s.Layout.ReadyDir())
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("listings side by side: %v", err)
		}
	}
}
