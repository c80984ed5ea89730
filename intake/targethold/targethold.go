// Package targethold keeps the feeds of one partner whose target table
// intake cannot write: why each is held, since when, and when its table is
// read again (Retry). The pipeline (intake/targethold.go) decides what is
// held and what a hold stops.
package targethold

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/target"
)

// Retry is how long a held feed waits before its table is read again.
var Retry = 30 * time.Second

// hold is why a feed is held and when its table is read again.
type hold struct {
	problem string // the table and what it lacks, or the SQLSTATE; never a value
	since   time.Time
	next    time.Time
}

// Feeds are one partner's held feeds, by feed name. The zero value holds
// none.
type Feeds struct {
	mu    sync.Mutex
	holds map[string]*hold
	n     atomic.Int32 // len(holds), read by a poll's gate without mu
}

// Any reports whether a feed is held, without the lock.
func (f *Feeds) Any() bool { return f.n.Load() != 0 }

// Held reports whether the feed is held now.
func (f *Feeds) Held(feed string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, held := f.holds[feed]
	return held
}

// Due reports whether the feed's table is to be read: it is not held, or
// its retry is due; held reports whether it is held.
func (f *Feeds) Due(feed string) (held, due bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.holds[feed]
	return h != nil, h == nil || !time.Now().Before(h.next)
}

// Later puts a held feed's next read a Retry from now (the database did
// not answer this time).
func (f *Feeds) Later(feed string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.holds[feed]; h != nil {
		h.next = time.Now().Add(Retry)
	}
}

// Change is what Set did.
type Change int

// What Set did.
const (
	Unchanged Change = iota // not held and not held now, or held still (its problem and retry renewed)
	Holds                   // held from now on
	Released                // held until now
)

// Set holds the feed for problem (a redacted error), or lets it go
// (problem ""), and says what changed; since is when a hold let go began.
func (f *Feeds) Set(feed, problem string) (c Change, since time.Time) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.holds[feed]
	switch {
	case problem == "" && h == nil:
		return Unchanged, time.Time{}
	case problem == "":
		delete(f.holds, feed)
		f.n.Add(-1)
		return Released, h.since
	case h == nil:
		if f.holds == nil {
			f.holds = map[string]*hold{}
		}
		f.holds[feed] = &hold{problem: problem, since: now, next: now.Add(Retry)}
		f.n.Add(1)
		return Holds, time.Time{}
	default:
		h.problem, h.next = problem, now.Add(Retry)
		return Unchanged, time.Time{}
	}
}

// Problems are the held feeds and why, nil when none.
func (f *Feeds) Problems() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.holds) == 0 {
		return nil
	}
	out := make(map[string]string, len(f.holds))
	for name, h := range f.holds {
		out[name] = h.problem
	}
	return out
}

// AllDue makes every held feed's table due to be read again (tests).
func (f *Feeds) AllDue() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.holds {
		h.next = time.Time{}
	}
}

// Unusable reports whether err is the database's answer that the target
// cannot be written (target.Load's finding, or class 42 about the table:
// a schema the role may not use), rather than a failure to ask it (a
// connection refused, the server full, a password rotated: not a
// property of the table).
func Unusable(err error) bool {
	var te *target.Error
	if errors.As(err, &te) {
		return true
	}
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	return errors.As(err, &pe) && strings.HasPrefix(pe.Code, "42") && !errors.As(err, &ce)
}
