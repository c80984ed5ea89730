package sftpconn_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// partnerOn is a partner with its own root on srv, under srv's account.
func partnerOn(t *testing.T, srv *sshdtest.Server, id string) *partners.Config {
	t.Helper()
	p := partner(t)
	root, err := srv.PartnerRoot(strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-") + "-" + id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "ready"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.ID = id
	p.SFTP.Address, p.SFTP.User, p.SFTP.PrivateKeyFile, p.SFTP.KnownHostsFile, p.SFTP.Root = srv.Addr, srv.User, srv.ClientKeyFile, srv.KnownHostsFile, root
	return p
}

// waitLogins waits until sshd holds n connections: what the site sees,
// not what the pool says.
func waitLogins(t *testing.T, srv *sshdtest.Server, n int) {
	t.Helper()
	got := -1
	testenv.WaitFor(t, 10*time.Second, func() bool {
		var err error
		if got, err = srv.Connections(); err != nil {
			t.Fatal(err)
		}
		return got == n
	}, func() string { return fmt.Sprintf("sshd holds %d connections, want %d", got, n) })
}

// readBack drops a file in the partner's ready/ and reads it through s.
func readBack(t *testing.T, s *sftpconn.Session, p *partners.Config) {
	t.Helper()
	body := "id\n" + p.ID + "\n"
	if err := os.WriteFile(filepath.Join(p.SFTP.Root, "ready", p.ID+".csv"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(fi os.FileInfo) error {
		names = append(names, fi.Name())
		return nil
	}); err != nil {
		t.Fatalf("partner %s: list: %v", p.ID, err)
	}
	if len(names) != 1 || names[0] != p.ID+".csv" {
		t.Fatalf("partner %s lists %v, want its own file alone", p.ID, names)
	}
	f, err := s.Open(s.Layout.ReadyDir() + "/" + p.ID + ".csv")
	if err != nil {
		t.Fatalf("partner %s: open: %v", p.ID, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil || string(b) != body {
		t.Fatalf("partner %s read %q, %v; want %q", p.ID, b, err, body)
	}
}

// Partners whose sites are one server under one account share SSH
// connections, up to the pool's number a connection; each still lists and
// reads its own root on channels of its own; a session that closes leaves
// the connection to the others, and the last one closes it.
func TestPartnersOnOneAccountShareConnections(t *testing.T) {
	srv, err := sshdtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pool := sftpconn.NewConns(3)
	var ps []*partners.Config
	var ss []*sftpconn.Session
	for i := range 4 {
		p := partnerOn(t, srv, fmt.Sprintf("s%d", i))
		s, err := pool.Dial(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ps, ss = append(ps, p), append(ss, s)
	}
	for i, s := range ss {
		readBack(t, s, ps[i])
	}
	waitLogins(t, srv, 2)
	if n := pool.Logins(); n != 2 {
		t.Fatalf("%d logins for 4 partners at 3 a connection, want 2", n)
	}
	ss[0].Close()
	readBack(t, ss[1], ps[1])
	readBack(t, ss[2], ps[2])
	waitLogins(t, srv, 2)
	for _, s := range ss[1:] {
		s.Close()
	}
	waitLogins(t, srv, 0)
	testenv.WaitFor(t, 10*time.Second, func() bool { return pool.Open() == 0 },
		func() string {
			return fmt.Sprintf("the pool counts %d connections open after every session closed", pool.Open())
		})
}

// sharing is two partners' sessions on one shared connection to an sshd
// of their own: hung, under an op timeout of its own, whose ready/ holds
// a FIFO (stuck.csv) that blocks its sftp-server in open(2) when opened;
// and good. Everything is closed, and the FIFO released, at the test's
// end.
type sharing struct {
	srv        *sshdtest.Server
	pool       *sftpconn.Conns
	hung, good *partners.Config
	hs, gs     *sftpconn.Session
}

func newSharing(t *testing.T, opTimeout time.Duration) *sharing {
	t.Helper()
	srv, err := sshdtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	x := &sharing{srv: srv, pool: sftpconn.NewConns(3), hung: partnerOn(t, srv, "hung"), good: partnerOn(t, srv, "good")}
	x.hung.SFTP.OpTimeout = opTimeout
	fifo := filepath.Join(x.hung.SFTP.Root, "ready", "stuck.csv")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // let sshd's stuck sftp-server go
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	for _, d := range []struct {
		p *partners.Config
		s **sftpconn.Session
	}{{x.hung, &x.hs}, {x.good, &x.gs}} {
		s, err := x.pool.Dial(context.Background(), d.p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		*d.s = s
	}
	waitLogins(t, srv, 1)
	return x
}

// waitStuck waits until the hung partner's sftp-server sleeps in open(2)
// of the FIFO: its OPEN has arrived.
func (x *sharing) waitStuck(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() bool { return x.srv.OpensWaiting() > 0 },
		testenv.Says("the OPEN of the FIFO never reached the sftp-server's open(2)"))
}

// One partner's request that its site's sftp-server never answers (an
// OPEN of a FIFO blocks it in open(2)) ends that partner's session on its
// deadline and nothing else: the other partner's session on the same
// connection goes on working throughout, then reports itself stale, so
// that its next poll dials afresh; no new session joins the connection,
// which closes when its last session leaves.
func TestAHungChannelEndsItsOwnSessionOnly(t *testing.T) {
	x := newSharing(t, time.Second)
	srv, pool, hung, good, hs, gs := x.srv, x.pool, x.hung, x.good, x.hs, x.gs
	done := make(chan error, 1)
	go func() {
		_, err := hs.Open(hs.Layout.ReadyDir() + "/stuck.csv")
		done <- err
	}()
	var herr error
	giveUp := time.After(time.Minute)
	for waiting := true; waiting; {
		select {
		case herr = <-done:
			waiting = false
		case <-time.After(100 * time.Millisecond):
			if _, err := gs.Stat(gs.Layout.ReadyDir()); err != nil {
				t.Fatalf("the good partner's session failed while the other's request hung: %v", err)
			}
		case <-giveUp:
			t.Fatal("the hung request did not end")
		}
	}
	var te *sftpconn.TimeoutError
	if !errors.As(herr, &te) || !errors.Is(herr, os.ErrDeadlineExceeded) || !hs.TimedOut() {
		t.Fatalf("the hung request ended with %v (timed out: %v), want a *sftpconn.TimeoutError", herr, hs.TimedOut())
	}
	readBack(t, gs, good)
	if !gs.Stale() {
		t.Fatal("the good partner's session does not say its connection takes no new sessions")
	}
	again, err := pool.Dial(context.Background(), hung)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	waitLogins(t, srv, 2)
	if again.Stale() {
		t.Fatal("a fresh session reports itself stale")
	}
	gs.Close()
	hs.Close()
	waitLogins(t, srv, 1) // the hung channel's connection ended with its last session
	if _, err := again.Stat(again.Layout.ReadyDir()); err != nil {
		t.Fatal(err)
	}
}

// A site that allows fewer channels a connection than the pool's sessions
// need (sshd MaxSessions 1: the first session's listing channel refused;
// 3: a second session's) refuses a joining partner's channels: no one
// joins that connection again, the refused partner gets a connection of
// its own, and every partner works; where the site allows a session's two
// channels, every session has both (a joiner's channels wait for the first
// session's, so they never take its slots). Dialled one after another and
// all at once.
func TestASiteThatRefusesAChannelGetsAConnectionOfItsOwn(t *testing.T) {
	for _, max := range []int{1, 3} {
		for _, together := range []bool{false, true} {
			t.Run(fmt.Sprintf("MaxSessions %d, together %v", max, together), func(t *testing.T) {
				srv, err := sshdtest.StartChannels(max)
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				pool := sftpconn.NewConns(3)
				ids := []string{"a", "b", "c"}
				ps := make([]*partners.Config, len(ids))
				ss := make([]*sftpconn.Session, len(ids))
				errs := make([]error, len(ids))
				var wg sync.WaitGroup
				for i, id := range ids {
					ps[i] = partnerOn(t, srv, id)
					dial := func() { defer wg.Done(); ss[i], errs[i] = pool.Dial(context.Background(), ps[i]) }
					wg.Add(1)
					if together {
						go dial()
					} else {
						dial()
					}
				}
				wg.Wait()
				for i := range ids {
					if errs[i] != nil {
						t.Fatalf("partner %s: %v", ids[i], errs[i])
					}
					defer ss[i].Close()
					readBack(t, ss[i], ps[i])
					if max >= 2 && !sftpconn.ListsOnItsOwnChannel(ss[i]) {
						t.Fatalf("partner %s lost its listing channel to another session", ids[i])
					}
				}
				waitLogins(t, srv, 3)
				if n := pool.Logins(); n != 3 {
					t.Fatalf("%d logins, want 3", n)
				}
			})
		}
	}
}

// A session closed (not timed out) while its request hangs ends at once
// and leaves the other partner's session working; its channel, which the
// site does not end, makes the connection take no new sessions an op
// timeout later.
func TestASessionClosedDuringAHangRetiresItsConnection(t *testing.T) {
	x := newSharing(t, 2*time.Second)
	good, hs, gs := x.good, x.hs, x.gs
	done := make(chan error, 1)
	go func() {
		_, err := hs.Open(hs.Layout.ReadyDir() + "/stuck.csv")
		done <- err
	}()
	// the OPEN blocks inside the sftp-server's open(2) of a FIFO
	x.waitStuck(t)
	hs.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the OPEN on a closed session succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hung request did not end with its session's close")
	}
	if gs.Stale() {
		t.Fatal("the connection was retired before the stuck channel had an op timeout to end")
	}
	testenv.WaitFor(t, 20*time.Second, func() bool {
		if gs.Stale() {
			return true
		}
		if _, err := gs.Stat(gs.Layout.ReadyDir()); err != nil {
			t.Fatalf("the good partner's session failed: %v", err)
		}
		return false
	}, testenv.Says("the connection still takes new sessions with a stuck channel on it"))
	readBack(t, gs, good)
}

// A write the site stopped taking (its sftp-server blocked in open(2) of a
// FIFO, so that it reads no more requests; the channel's window used up)
// outlives its channel: the session's close returns at once, and an op
// timeout later the connection is closed, which ends the write (the one
// case where one partner's failure reaches the sessions sharing its
// connection).
func TestAStuckWriteEndsWithItsConnection(t *testing.T) {
	x := newSharing(t, time.Second)
	hs, gs := x.hs, x.gs
	f, err := hs.Create(hs.Layout.ReadyDir() + "/big.part")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Open(hs.Layout.ReadyDir() + "/stuck.csv") // the sftp-server stops here
	x.waitStuck(t)
	done := make(chan error, 1)
	go func() {
		_, err := f.Write(make([]byte, 16<<20))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("16 MiB written to a stuck sftp-server")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck write did not end")
	}
	if !hs.TimedOut() {
		t.Fatal("the session with the stuck write did not time out")
	}
	start := time.Now()
	hs.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("closing a session with a stuck write took %s", d)
	}
	if !gs.Stale() {
		t.Fatal("the good partner's session does not know its connection ended")
	}
}

// A dial that joins a connection still being made ends within its own
// sftp.dial_timeout, its wait for that connection included: against a
// site that accepts the TCP connection and never answers, a partner that
// joins another's dial half-way fails when its own dial timeout is up,
// not when the first dial's has passed and a dial of its own after that
// (one and a half timeouts).
func TestAJoinerDialEndsWithinItsDialTimeout(t *testing.T) {
	const timeout = 3 * time.Second
	proxy, first, joiner := frozenSite(t, timeout)
	pool := sftpconn.NewConns(3)
	firstErr := make(chan error, 1)
	go func() {
		_, err := pool.Dial(context.Background(), first)
		firstErr <- err
	}()
	// the first dial is under way (its connection held by the frozen
	// site): the joiner waits for it
	testenv.WaitFor(t, timeout, func() bool { return proxy.Accepted() > 0 })
	start := time.Now()
	_, err := pool.Dial(context.Background(), joiner)
	took := time.Since(start)
	if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "sftp.dial_timeout") {
		t.Fatalf("the joiner's dial to a site that never answers: %v, want a dial_timeout deadline error", err)
	}
	// within its own timeout, with room for a slow machine: without the
	// bound it takes half a timeout more
	if took > timeout+timeout/4 {
		t.Fatalf("the joiner's dial took %s, over its dial_timeout %s", took.Round(time.Millisecond), timeout)
	}
	if err := <-firstErr; err == nil {
		t.Fatal("the first dial to a site that never answers succeeded")
	}
	if n := pool.Logins(); n != 0 {
		t.Fatalf("%d logins counted against a site that never answered", n)
	}
}

// A partner that joins a connection whose first session comes up with
// less than a quarter of the joiner's dial timeout left does not start
// its channels on it: it fails with a deadline error and leaves the
// connection as it found it (the start's timer would otherwise retire a
// healthy connection for the joiner's wait), and it makes no login of
// its own that could not start a session either.
func TestALateJoinerLeavesTheConnectionAlone(t *testing.T) {
	const timeout = 8 * time.Second
	proxy, first, joiner := frozenSite(t, timeout)
	pool := sftpconn.NewConns(3)
	type dialled struct {
		s   *sftpconn.Session
		err error
	}
	firstDone := make(chan dialled, 1)
	start := time.Now()
	go func() {
		s, err := pool.Dial(context.Background(), first)
		firstDone <- dialled{s, err}
	}()
	testenv.WaitFor(t, timeout, func() bool { return proxy.Accepted() > 0 }) // the first dial is under way
	joined := make(chan dialled, 1)
	go func() {
		s, err := pool.Dial(context.Background(), joiner)
		joined <- dialled{s, err}
	}()
	// the site answers once the joiner has less than a quarter of its
	// timeout left, the first dial still a second or so; the joiner waits
	// on the site until then
	late := time.NewTimer(time.Until(start.Add(timeout * 85 / 100)))
	defer late.Stop()
	select {
	case <-late.C:
	case j := <-joined:
		t.Fatalf("the joiner ended before the site answered: %v", j.err)
	}
	proxy.Thaw()
	f := <-firstDone
	if f.err != nil {
		t.Fatalf("the first dial: %v", f.err)
	}
	defer f.s.Close()
	j := <-joined
	if j.err == nil {
		j.s.Close()
		t.Fatal("a joiner with less than a quarter of its dial timeout left started a session")
	}
	if !errors.Is(j.err, os.ErrDeadlineExceeded) {
		t.Fatalf("the late joiner: %v, want a deadline error", j.err)
	}
	if f.s.Stale() {
		t.Fatal("the late joiner retired the first session's connection")
	}
	if _, err := f.s.Stat(f.s.Layout.ReadyDir()); err != nil {
		t.Fatalf("the first session after the late joiner: %v", err)
	}
	if n := pool.Logins(); n != 1 {
		t.Fatalf("%d logins, want the first dial's alone", n)
	}
}

// frozenSite is a real sshd behind a proxy that is frozen (it takes TCP
// connections and forwards nothing until thawed), and two partners on it
// under one account, "first" and "joiner", with the given dial timeout.
func frozenSite(t *testing.T, dialTimeout time.Duration) (*testenv.Proxy, *partners.Config, *partners.Config) {
	t.Helper()
	srv, err := sshdtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	proxy := testenv.NewProxy(t, srv.Addr)
	proxy.Freeze()
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{proxy.Addr()}, srv.HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, joiner := partnerOn(t, srv, "first"), partnerOn(t, srv, "joiner")
	for _, p := range []*partners.Config{first, joiner} {
		p.SFTP.Address, p.SFTP.KnownHostsFile, p.SFTP.DialTimeout = proxy.Addr(), kh, dialTimeout
	}
	return proxy, first, joiner
}

// The channels one connection starts, as intake check measures them
// (Probe: sshd's MaxSessions 1, 3 and 4; 8 or more at the default), and a
// pool told that count (SetChannels, as the daemon is from the profile
// check kept) puts no more sessions on a connection than have their three
// channels each: on a site of 4 channels a connection, three partners on
// one account get a connection each, every session keeps its listing
// channel and gets its second download channel (Ranges), and no channel
// is refused. Untold, two sessions share a connection, the third's
// listing channel is refused, and a shared session's Ranges is too.
func TestAPoolToldTheMeasuredChannelsPutsNoMoreSessionsOnAConnection(t *testing.T) {
	for _, max := range []int{1, 3, 4, 0} {
		t.Run(fmt.Sprintf("MaxSessions %d", max), func(t *testing.T) {
			start := func() (*sshdtest.Server, error) { return sshdtest.StartChannels(max) }
			if max == 0 {
				start = sshdtest.Start // MaxSessions 50
			}
			srv, err := start()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			ids := []string{"a", "b", "c"}
			ps := make([]*partners.Config, len(ids))
			for i, id := range ids {
				ps[i] = partnerOn(t, srv, id)
			}
			prof, err := sftpconn.Probe(context.Background(), ps[0], "w1")
			if err != nil {
				t.Fatal(err)
			}
			want := max
			if max == 0 {
				want = 8
			}
			if prof.Channels != want {
				t.Fatalf("measured %d channels a connection, want %d (%s)", prof.Channels, want, prof)
			}
			if max != 4 {
				return
			}
			pool := sftpconn.NewConns(3)
			pool.SetChannels(ps[0], prof.Channels)
			ss := make([]*sftpconn.Session, len(ps))
			for i, p := range ps {
				if ss[i], err = pool.Dial(context.Background(), p); err != nil {
					t.Fatalf("partner %s: %v", ids[i], err)
				}
				defer ss[i].Close()
			}
			for i, s := range ss {
				readBack(t, s, ps[i])
				if !sftpconn.ListsOnItsOwnChannel(s) {
					t.Fatalf("partner %s has no listing channel of its own", ids[i])
				}
				if s.Ranges() == nil {
					t.Fatalf("partner %s: its second download channel was refused", ids[i])
				}
			}
			waitLogins(t, srv, 3)
		})
	}
}
