package sftpconn

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// run watches w alone until done; on expiry it calls expire once and
// returns.
func (w *watchdog) run(done <-chan struct{}, expire func()) {
	expired := make(chan struct{})
	stop := watchAll(func() { expire(); close(expired) }, w)
	select {
	case <-done:
		stop()
	case <-expired:
	}
}

func packet(n int) []byte {
	b := make([]byte, 4+n)
	binary.BigEndian.PutUint32(b, uint32(n))
	return b
}

// nameReply is a NAME packet announcing count names (its body beyond the
// count is filler: the framer reads the count alone).
func nameReply(count uint32, body int) []byte {
	b := packet(9 + body)
	b[4] = fxpName
	binary.BigEndian.PutUint32(b[9:], count)
	return b
}

func TestFramerCountsPacketsAcrossAnySplit(t *testing.T) {
	var stream []byte
	sizes := []int{0, 1, 5, 3, 32 << 10, 9, 255 << 10}
	for _, n := range sizes {
		stream = append(stream, packet(n)...)
	}
	// NAME replies among them: their counts add up, whatever the split;
	// a packet too short to hold a count, and another type, add nothing
	names := []uint32{7, 0, 300, 1 << 20}
	for _, c := range names {
		stream = append(stream, nameReply(c, 100)...)
		sizes = append(sizes, 0)
	}
	short := packet(3)
	short[4] = fxpName
	stream = append(stream, short...)
	sizes = append(sizes, 0)
	want := int64(0)
	for _, c := range names {
		want += int64(c)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		var f framer
		starts, ends := 0, 0
		for rest := stream; len(rest) > 0; {
			k := 1 + rng.IntN(min(len(rest), 7000))
			s, e := f.packets(rest[:k])
			starts, ends = starts+s, ends+e
			if ends > starts {
				t.Fatalf("round %d: %d ends before %d starts", round, ends, starts)
			}
			rest = rest[k:]
		}
		if starts != len(sizes) || ends != len(sizes) {
			t.Fatalf("round %d: got %d starts and %d ends, want %d", round, starts, ends, len(sizes))
		}
		if f.names != want {
			t.Fatalf("round %d: %d names counted, want %d", round, f.names, want)
		}
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// A reply that keeps arriving renews the deadline however long it takes
// in total; once it stops, the connection is closed. A reply that only
// trickles (less than minProgress bytes an op timeout, no reply ending)
// keeps nothing alive: each byte within the timeout would otherwise hold
// the request for as many timeouts as the reply has bytes.
func TestWatchdogIsAnInactivityDeadline(t *testing.T) {
	const timeout = 500 * time.Millisecond
	for _, c := range []struct {
		name    string
		chunk   int  // bytes sent every timeout/10
		expires bool // before six timeouts have passed
	}{
		{"moving", minProgress / 4, false},
		{"trickling", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWatchdog(timeout)
			closed := make(chan struct{})
			done := make(chan struct{})
			defer close(done)
			go w.run(done, func() { close(closed) })
			pr, pw := io.Pipe()
			defer pw.Close()
			r := watchedReader{w: w, r: pr}
			go io.Copy(io.Discard, r)
			if _, err := (watchedWriter{w: w, wc: nopCloser{io.Discard}}).Write(packet(10)); err != nil {
				t.Fatal(err)
			}
			// the reply comes over six deadlines' worth of time, and
			// stops before its end
			reply := packet(1 << 20)
			start := time.Now()
			for off := 0; time.Since(start) < 6*timeout; off += c.chunk {
				if _, err := pw.Write(reply[off : off+c.chunk]); err != nil {
					t.Fatal(err)
				}
				select {
				case <-closed:
					if !c.expires {
						t.Fatalf("closed after %s while a reply kept moving", time.Since(start))
					}
					if took := time.Since(start); took < timeout/2 {
						t.Fatalf("closed after %s, well within the op timeout", took)
					}
					return
				case <-time.After(timeout / 10):
				}
			}
			if c.expires {
				t.Fatal("a trickling reply kept its request alive for six op timeouts")
			}
			// silence with the request still unanswered: closed
			<-closed
			if !w.expired.Load() {
				t.Fatal("closed without expiring")
			}
		})
	}
}

// Nothing pending, nothing to wait for: a quiet session stays open
// however long it is quiet; a request starts its deadline when it is sent.
func TestWatchdogLeavesAnIdleSessionAlone(t *testing.T) {
	w := newWatchdog(time.Minute)
	if w.due(time.Now().Add(time.Hour)) {
		t.Fatal("an idle session is due")
	}
	w.last.Store(time.Now().Add(-time.Hour).UnixNano()) // quiet for an hour
	ww := watchedWriter{w: w, wc: nopCloser{io.Discard}}
	if _, err := ww.Write(packet(1)); err != nil {
		t.Fatal(err)
	}
	if w.due(time.Now()) {
		t.Fatal("a request sent after a quiet hour is due at once")
	}
	if !w.due(time.Now().Add(2 * time.Minute)) {
		t.Fatal("an unanswered request is not due past its deadline")
	}
	r := watchedReader{w: w, r: bytesReader(packet(0))}
	io.Copy(io.Discard, r)
	if w.pending.Load() != 0 || w.due(time.Now().Add(time.Hour)) {
		t.Fatalf("answered, yet %d pending", w.pending.Load())
	}
}

func bytesReader(b []byte) io.Reader { return &sliceReader{b} }

type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// A request that may take long without a byte (a RENAME a server makes as
// a copy) has the allowance on top of the timeout while it is pending;
// once the allowance is given back the plain deadline holds again, and
// nested allowances keep the largest.
func TestWatchdogAllowsASlowRenameItsCopyTime(t *testing.T) {
	w := newWatchdog(time.Second)
	w.pending.Store(1)
	now := time.Now()
	w.last.Store(now.Add(-3 * time.Second).UnixNano())
	if !w.due(now) {
		t.Fatal("3 s of silence past a 1 s timeout is not due")
	}
	done := w.allowSlow(5 * time.Second)
	if w.due(now) {
		t.Fatal("due within the allowance")
	}
	inner := w.allowSlow(time.Second) // smaller: the larger stays
	if w.due(now) {
		t.Fatal("a smaller allowance took the larger's place")
	}
	inner()
	if w.due(now) {
		t.Fatal("giving back the smaller allowance ended the larger")
	}
	done()
	if !w.due(now) {
		t.Fatal("not due once the allowance was given back")
	}
	var s Session // a session without a watchdog: nothing to allow
	s.AllowCopy(1 << 30)()
}

// The sessions of a cadence are watched by one goroutine: the session
// whose channel left a request unanswered past its timeout is ended, once,
// and only its waiting channel is marked expired; the idle ones are not;
// the goroutine ends with the last session's stop.
func TestOneGoroutineWatchesTheSessionsOfACadence(t *testing.T) {
	const timeout = 100 * time.Millisecond // a cadence no other test's sessions use
	// runners counts the goroutines checking the set of s
	runners := func(s *watchSet) (n int) {
		for _, g := range strings.Split(testenv.Stacks(), "\n\n") {
			if strings.Contains(g, fmt.Sprintf("sftpconn.(*watchSet).run(%p", s)) {
				n++
			}
		}
		return n
	}
	set := func() *watchSet {
		watchers.mu.Lock()
		defer watchers.mu.Unlock()
		return watchers.sets[timeout/4]
	}
	if set() != nil {
		t.Fatal("a set of this cadence before the test")
	}
	type sess struct {
		ws    []*watchdog
		ended chan struct{}
		stop  func()
	}
	var all []*sess
	for i := range 50 {
		s := &sess{ws: []*watchdog{newWatchdog(timeout), newWatchdog(timeout), newWatchdog(timeout)}, ended: make(chan struct{}, 2)}
		if i == 7 {
			if _, err := (watchedWriter{w: s.ws[2], wc: nopCloser{io.Discard}}).Write(packet(10)); err != nil {
				t.Fatal(err)
			}
		}
		s.stop = watchAll(func() { s.ended <- struct{}{} }, s.ws...)
		all = append(all, s)
	}
	ours := set()
	watchers.mu.Lock()
	members := len(ours.members)
	watchers.mu.Unlock()
	// a goroutine not yet scheduled shows no arguments in a dump: wait
	// until the set's goroutine runs, then count
	testenv.WaitFor(t, time.Minute, func() bool { return runners(ours) > 0 }, testenv.Says("the set's goroutine never ran"))
	if n := runners(ours); n != 1 || members != 50 {
		t.Fatalf("50 sessions of one cadence: %d goroutines check their set of %d; want 1 and 50", n, members)
	}
	select {
	case <-all[7].ended:
	case <-time.After(time.Minute):
		t.Fatal("the session was not ended while a request waited past its timeout")
	}
	// the ended session left its set at its expiry: no later tick ends it
	// again; the others stay
	watchers.mu.Lock()
	members = len(ours.members)
	watchers.mu.Unlock()
	if members != 49 {
		t.Fatalf("%d sessions in the set after one expired, want 49", members)
	}
	for i, s := range all {
		if n := len(s.ended); n != 0 {
			t.Fatalf("session %d ended %d more times", i, n)
		}
		for j, w := range s.ws {
			if want := i == 7 && j == 2; w.expired.Load() != want {
				t.Fatalf("session %d channel %d expired %v, want %v", i, j, w.expired.Load(), want)
			}
		}
		s.stop()
	}
	if set() != nil {
		t.Fatal("the cadence's set kept after its last session's stop")
	}
	testenv.WaitFor(t, time.Minute, func() bool { return runners(ours) == 0 },
		testenv.Says("the set's goroutine still runs a minute after its last session's stop"))
}
