package intake_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// sites makes n partner sites polled on poll.
func sites(t *testing.T, prefix string, n int, poll string) []*testenv.Site {
	t.Helper()
	var out []*testenv.Site
	for i := range n {
		s := testenv.NewSite(t, fmt.Sprintf("%s-%02d", prefix, i))
		s.Config.Poll = poll
		out = append(out, s)
	}
	return out
}

// A daemon starting with many partners on one server never has more
// dials in flight to it than sessions.max_parallel_dials (OpenSSH refuses
// bursts of unauthenticated connections beyond MaxStartups), and every
// partner is still polled and keeps its session. The partners' sites are
// one account on one server: their sessions share SSH connections,
// sessions.partners_per_connection (default 3) a connection.
func TestDialsToOneServerAreBounded(t *testing.T) {
	_, pool := testenv.DB(t)
	ss := sites(t, "dial", 24, "@every 1h")
	// a stagger of 1 ms: every first poll comes within 24 ms of the start,
	// so the partners' dials all wait on the bound together
	r := newRigCfg(t, pool, intake.Config{WorkerID: "dials", Lease: 30 * time.Second, SpoolMinFree: 1,
		Sessions: intake.SessionPolicy{MaxParallelDials: 3}, PollStagger: time.Millisecond}, ss...)
	polled := &intake.Signals(r.d).Polled
	polled.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < len(ss) {
		v := polled.WaitOrTimeout()
		if v.Err != nil {
			t.Fatalf("poll of %s: %v", v.Partner, v.Err)
		}
		seen[v.Partner] = true
	}
	dialed, peak, open := intake.DialStats(r.d)
	if peak > 3 || peak < 1 {
		t.Fatalf("at most %d dials were in flight at once, want 1 to 3 (max_parallel_dials)", peak)
	}
	if dialed != int64(len(ss)) || open != int64(len(ss)) {
		t.Fatalf("%d dials and %d sessions open, want %d of each (one per partner, kept open)", dialed, open, len(ss))
	}
	if n := intake.SSHLogins(r.d); n != int64(len(ss)/intake.DefaultPartnersPerConnection) {
		t.Fatalf("%d SSH logins for %d partners on one account, want %d", n, len(ss), len(ss)/intake.DefaultPartnersPerConnection)
	}
	// a second cycle reuses every session: no dial
	for _, s := range ss {
		r.poll(s.Config.ID)
	}
	if d, _, _ := intake.DialStats(r.d); d != dialed {
		t.Fatalf("a second poll of every partner dialled %d more times, want 0", d-dialed)
	}
}

// The bound is per server (MaxStartups is): a site that takes the TCP
// connection and then says nothing holds its own partner's dial until the
// dial timeout, not the dials of partners on other servers, even with a
// bound of one.
func TestASilentSiteDoesNotHoldUpOtherServersDials(t *testing.T) {
	_, pool := testenv.DB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the kernel completes the handshake, no banner comes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	silent, good := testenv.NewSite(t, "silent"), testenv.NewSite(t, "good")
	silent.Config.SFTP.Address = ln.Addr().String()
	// a host key pinned for the address, so the dial gets as far as the
	// connection (it would be refused before it otherwise)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{ln.Addr().String()}, testenv.SSHD().HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	silent.Config.SFTP.KnownHostsFile = kh
	silent.Config.SFTP.DialTimeout = 2 * time.Minute
	r := newRigCfg(t, pool, intake.Config{WorkerID: "silent", Lease: 30 * time.Second, SpoolMinFree: 1,
		Sessions: intake.SessionPolicy{MaxParallelDials: 1}}, silent, good)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.d.PollOnce(ctx, "silent") }()
	for intake.DialsInFlight(r.d) == 0 { // the silent site's dial holds its server's one slot
		select {
		case err := <-done:
			t.Fatalf("the silent site's poll ended before its dial was in flight: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	good.Drop(t, "orders-g.csv", testenv.OrdersCSV("G", 2))
	r.poll("good") // within a minute, while the silent dial waits for its two
	if files := testenv.Files(t, pool, "good"); len(files) != 1 || files[0].State != "archived" {
		t.Fatalf("good's file: %+v", files)
	}
	select {
	case err := <-done:
		t.Fatalf("the silent site's dial ended first (%v): the test proves nothing", err)
	default:
	}
	cancel()
	ln.Close() // the queued connection is reset: the silent dial fails now
	if err := <-done; err == nil {
		t.Fatal("the silent site's poll succeeded")
	}
}

// Prewarm (intake run --once) dials every partner within the same bound.
func TestPrewarmKeepsToTheDialBound(t *testing.T) {
	_, pool := testenv.DB(t)
	ss := sites(t, "warm", 12, "@every 1h")
	r := newRigCfg(t, pool, intake.Config{WorkerID: "prewarm", Lease: 30 * time.Second, SpoolMinFree: 1,
		Sessions: intake.SessionPolicy{MaxParallelDials: 2}}, ss...)
	r.d.Prewarm(context.Background())
	for _, s := range ss {
		r.poll(s.Config.ID) // waits for its prewarm dial, reuses the session
	}
	dialed, peak, open := intake.DialStats(r.d)
	if peak > 2 || peak < 1 {
		t.Fatalf("at most %d dials were in flight at once, want 1 to 2", peak)
	}
	if dialed != int64(len(ss)) || open != int64(len(ss)) {
		t.Fatalf("%d dials and %d sessions open, want %d of each", dialed, open, len(ss))
	}
}

// The partners of an `@every` interval are first polled at stable offsets
// spread over the interval, on the grid of whole seconds (and every later
// tick keeps that phase): not all at once. Offsets only; the ticks
// themselves are the schedule's (internal/schedule's test).
func TestFirstPollsAreSpreadOverTheInterval(t *testing.T) {
	_, pool := testenv.DB(t)
	ss := sites(t, "spread", 40, "@every 30s")
	cron := testenv.NewSite(t, "spread-cron")
	cron.Config.Poll = "*/5 * * * *"
	cfg := intake.Config{WorkerID: "spread", Lease: 30 * time.Second, SpoolMinFree: 1, PollStagger: time.Second}
	all := append(append([]*testenv.Site(nil), ss...), cron)
	a := newRigCfg(t, pool, cfg, all...)
	b := newRigCfg(t, pool, cfg, all...)
	const every = 30 * time.Second
	seen := map[time.Duration]bool{}
	lo, hi := every, time.Duration(0)
	for _, s := range ss {
		off, ev, ok := intake.PollOffset(a.d, s.Config.ID)
		if !ok || ev != every {
			t.Fatalf("%s: interval %s (phased %v), want %s", s.Config.ID, ev, ok, every)
		}
		if off < 0 || off >= every || off%time.Second != 0 {
			t.Fatalf("%s: offset %s outside the interval or off the grid of whole seconds", s.Config.ID, off)
		}
		if again, _, _ := intake.PollOffset(b.d, s.Config.ID); again != off {
			t.Fatalf("%s: offset %s in one daemon, %s in another: not stable", s.Config.ID, off, again)
		}
		seen[off] = true
		lo, hi = min(lo, off), max(hi, off)
	}
	if len(seen) < 15 {
		t.Fatalf("%d distinct offsets for %d partners over the 30 seconds, want them spread over most", len(seen), len(ss))
	}
	if hi-lo < every/2 {
		t.Fatalf("offsets span %s..%s: not spread over the %s interval", lo, hi, every)
	}
	if _, _, ok := intake.PollOffset(a.d, cron.Config.ID); ok {
		t.Fatal("a cron-expression schedule was phased; it runs as written")
	}
	// a handful of partners at the default stagger: polled within a moment
	// of the start, not up to an interval later
	few := newRigCfg(t, pool, intake.Config{WorkerID: "spread-few", Lease: 30 * time.Second, SpoolMinFree: 1}, ss[:3]...)
	for _, s := range ss[:3] {
		if off, _, _ := intake.PollOffset(few.d, s.Config.ID); off >= 3*intake.DefaultPollStagger {
			t.Fatalf("%s: offset %s with 3 partners, want under %s", s.Config.ID, off, 3*intake.DefaultPollStagger)
		}
	}
}

// A session no poll used for sessions.idle_close is closed; the next poll
// dials again and takes a file through.
func TestIdleSessionIsClosedAndTheNextPollRedials(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "idle")
	site.Config.Poll = "@every 1h"
	r := newRigCfg(t, pool, intake.Config{WorkerID: "idle", Lease: 30 * time.Second, SpoolMinFree: 1,
		Sessions: intake.SessionPolicy{IdleClose: 300 * time.Millisecond}}, site)
	sig := intake.Signals(r.d)
	sig.Polled.Init(t)
	sig.IdleClosed.Init(t)
	if err := r.d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v := sig.Polled.WaitOrTimeout(); v.Err != nil {
		t.Fatalf("first poll: %v", v.Err)
	}
	if got := sig.IdleClosed.WaitOrTimeout(); got != "idle" {
		t.Fatalf("idle close of %q, want idle", got)
	}
	if dialed, _, open := intake.DialStats(r.d); dialed != 1 || open != 0 {
		t.Fatalf("after the idle close: %d dials, %d open; want 1 and 0", dialed, open)
	}
	site.Drop(t, "orders-idle.csv", testenv.OrdersCSV("I", 3))
	sig.Polled.Clear()
	r.d.Poke("idle")
	if v := sig.Polled.WaitOrTimeout(); v.Err != nil {
		t.Fatalf("poll after the idle close: %v", v.Err)
	}
	files := testenv.Files(t, pool, "idle")
	if len(files) != 1 || files[0].State != "archived" {
		t.Fatalf("files after the redial: %+v, want orders-idle.csv archived", files)
	}
	if dialed, _, _ := intake.DialStats(r.d); dialed != 2 {
		t.Fatalf("%d dials, want 2 (the poll after the idle close dialled again)", dialed)
	}
}

// With sessions.max_open, a dial beyond the cap closes the least recently
// used session of a partner that is not polling; that partner's next poll
// dials again and works.
func TestSessionCapClosesTheLeastRecentlyUsed(t *testing.T) {
	_, pool := testenv.DB(t)
	ss := sites(t, "cap", 3, "@every 1h")
	r := newRigCfg(t, pool, intake.Config{WorkerID: "cap", Lease: 30 * time.Second, SpoolMinFree: 1,
		Sessions: intake.SessionPolicy{MaxOpen: 2}}, ss...)
	a, b, c := ss[0].Config.ID, ss[1].Config.ID, ss[2].Config.ID
	for _, id := range []string{a, b, c} {
		r.poll(id)
	}
	if dialed, _, open := intake.DialStats(r.d); dialed != 3 || open != 2 {
		t.Fatalf("%d dials, %d open; want 3 and 2 (a's session closed for c's)", dialed, open)
	}
	r.poll(b) // b's session is still open: no dial
	if dialed, _, _ := intake.DialStats(r.d); dialed != 3 {
		t.Fatalf("polling b dialled (%d dials): its session should have been kept", dialed)
	}
	ss[0].Drop(t, "orders-cap.csv", testenv.OrdersCSV("C", 2))
	r.poll(a) // dials again, closing c's (less recently used than b's)
	if dialed, _, open := intake.DialStats(r.d); dialed != 4 || open != 2 {
		t.Fatalf("%d dials, %d open; want 4 and 2", dialed, open)
	}
	if files := testenv.Files(t, pool, a); len(files) != 1 || files[0].State != "archived" {
		t.Fatalf("a's file after its redial: %+v", files)
	}
	r.poll(b)
	if dialed, _, _ := intake.DialStats(r.d); dialed != 4 {
		t.Fatalf("polling b dialled (%d dials): c's session should have been the one closed", dialed)
	}
}
