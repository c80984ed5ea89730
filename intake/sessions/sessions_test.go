package sessions

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// holder is a partner's session as a test sets it.
type holder struct {
	at      int64
	open    bool
	polling bool
	book    *Book // counts the session closed, as Slot.Drop does
}

func (h *holder) LastUsed() (int64, bool) { return h.at, h.open }

func (h *holder) DropUnlessPolling(cut int64) (bool, bool) {
	if h.polling {
		return true, false
	}
	if !h.open || h.at > cut {
		return false, false
	}
	h.open = false
	if h.book != nil {
		h.book.Closed()
	}
	return false, true
}

func TestMakeRoomClosesTheLeastRecentlyUsedUntilUnderTheCap(t *testing.T) {
	b := NewBook(1, noGauge{})
	self, old, older, oldest := &holder{at: 9}, &holder{at: 3, open: true, book: b}, &holder{at: 2, open: true, book: b}, &holder{at: 1, open: true, book: b}
	for range 3 {
		b.Opened()
	}
	closed := b.MakeRoom(self, func() []Holder { return []Holder{self, old, older, oldest} }, 3)
	if len(closed) != 1 || closed[0] != oldest || oldest.open || !older.open {
		t.Fatalf("closed %v, want the least recently used one only", closed)
	}
	// the cap is soft: a polling partner's session is never closed, and
	// nothing after it either
	older.polling = true
	if closed := b.MakeRoom(self, func() []Holder { return []Holder{self, old, older} }, 2); len(closed) != 0 || !old.open {
		t.Fatalf("closed %v under a poll, want none", closed)
	}
	if closed := b.MakeRoom(self, func() []Holder { t.Fatal("the holders listed without a cap"); return nil }, 0); len(closed) != 0 {
		t.Fatalf("closed %v without a cap", closed)
	}
}

func TestCloseIdleClosesOnlyIdleSessionsOfPartnersNotPolling(t *testing.T) {
	now := time.Unix(1000, 0)
	idle, busy, fresh, none := &holder{at: now.Add(-time.Hour).UnixNano(), open: true},
		&holder{at: now.Add(-time.Hour).UnixNano(), open: true, polling: true},
		&holder{at: now.Add(-time.Second).UnixNano(), open: true}, &holder{}
	closed := CloseIdle([]Holder{idle, busy, fresh, none}, now, time.Minute)
	if len(closed) != 1 || closed[0] != idle || idle.open || !busy.open || !fresh.open {
		t.Fatalf("closed %v, want the idle session of a partner not polling only", closed)
	}
}

func TestPolicyDefaultsAndBounds(t *testing.T) {
	var p Policy
	if err := p.Validate(); err != nil || p.MaxParallelDials != DefaultMaxParallelDials || p.IdleClose != DefaultIdleClose || p.PartnersPerConnection != DefaultPartnersPerConnection {
		t.Fatalf("%+v %v, want the defaults", p, err)
	}
	for _, bad := range []Policy{{MaxParallelDials: 1001}, {MaxOpen: -1}, {IdleClose: -time.Second}, {PartnersPerConnection: 101}} {
		if err := bad.Validate(); err == nil {
			t.Fatalf("%+v validated", bad)
		}
	}
}

func TestOffsetIsStableAndWithinItsWindow(t *testing.T) {
	a, b := Offset("p1", 30*time.Second, 1000, DefaultPollStagger), Offset("p1", 30*time.Second, 1000, DefaultPollStagger)
	if a != b || a < 0 || a >= 30*time.Second {
		t.Fatalf("offsets %s, %s: want one, within the interval", a, b)
	}
	if o := Offset("p1", 30*time.Second, 3, DefaultPollStagger); o >= 3*DefaultPollStagger {
		t.Fatalf("offset %s with 3 partners, want under %s", o, 3*DefaultPollStagger)
	}
}

// A fleet's phases lie on a grid of PhaseGrain, so the partners of one
// grain are polled in one wake-up of the scheduler, and still spread over
// the whole interval: a thousand partners `@every 30s` fill its thirty
// seconds, about a thirtieth of them each. A window narrower than a few
// grains (a handful of partners) keeps its phases as they are.
func TestAFleetsPhasesLieOnAGridAndSpreadOverTheInterval(t *testing.T) {
	const n = 1000
	perGrain := map[time.Duration]int{}
	for i := range n {
		o := Offset(fmt.Sprintf("partner-%d", i), 30*time.Second, n, DefaultPollStagger)
		if o%PhaseGrain != 0 || o < 0 || o >= 30*time.Second {
			t.Fatalf("offset %s: want a whole grain of %s within the interval", o, PhaseGrain)
		}
		perGrain[o]++
	}
	if len(perGrain) != 30 {
		t.Fatalf("%d grains used, want all 30 of the interval", len(perGrain))
	}
	for o, k := range perGrain {
		if k < n/30/2 || k > n/30*2 {
			t.Errorf("grain %s has %d partners, want about %d", o, k, n/30)
		}
	}
	fine := 0
	for i := range 3 {
		if Offset(fmt.Sprintf("p%d", i), 30*time.Second, 3, DefaultPollStagger)%PhaseGrain != 0 {
			fine++
		}
	}
	if fine == 0 {
		t.Fatal("three partners' phases were put on the grid: their window is narrower than one grain")
	}
}

// The dial bound counts logins: a dial that has logged in and still
// prepares its site (directories, the profile measured: a dozen round
// trips to a far site) holds no other partner's dial back; a dial that
// ends without saying so gives its slot back at its end.
func TestADialGivesItsSlotBackOnceLoggedIn(t *testing.T) {
	book := NewBook(1, prometheus.NewGauge(prometheus.GaugeOpts{Name: "open"}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var first, second, third Slot
	first.Book, second.Book, third.Book = book, book, book
	preparing, prepared := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		_, _, _, err := first.Get(ctx, "srv", func() {}, func(_ context.Context, loggedIn func()) (*sftpconn.Session, error) {
			loggedIn()
			close(preparing)
			<-prepared
			return nil, errors.New("the site could not be prepared")
		})
		firstDone <- err
	}()
	<-preparing
	dialled := make(chan struct{})
	secondDone := make(chan error, 1)
	go func() {
		_, _, _, err := second.Get(ctx, "srv", func() {}, func(context.Context, func()) (*sftpconn.Session, error) {
			close(dialled)
			return nil, errors.New("refused before its login")
		})
		secondDone <- err
	}()
	select {
	case <-dialled:
	case <-ctx.Done():
		t.Fatal("a dial waited for another's preparation after its login")
	}
	if err := <-secondDone; err == nil {
		t.Fatal("the second dial's error was lost")
	}
	close(prepared)
	if err := <-firstDone; err == nil {
		t.Fatal("the first dial's error was lost")
	}
	// both slots given back: the next dial is not held back
	if _, _, _, err := third.Get(ctx, "srv", func() {}, func(context.Context, func()) (*sftpconn.Session, error) {
		return nil, errors.New("done")
	}); err == nil || ctx.Err() != nil {
		t.Fatalf("a third dial: %v (the slots were not given back)", err)
	}
	if _, peak, inFlight := book.Stats(); peak != 1 || inFlight != 0 {
		t.Fatalf("peak %d, in flight %d; want 1 and 0", peak, inFlight)
	}
}
