// Package affinity decides which replica polls a partner: the one of the
// live replicas serving it that rendezvous hashing of (replica, partner)
// ranks first (internal/rendezvous).
package affinity

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/rendezvous"
)

// Partner affinity. With several replicas on one database, each partner is
// polled by one of the live replicas that serve it: the one rendezvous
// hashing of (replica, partner) ranks first. Replicas then do not race for
// the same files, RENAME against RENAME, oldest first (measured on the
// small-file bench: two daemons sharing all partners ran at 0.83-0.87x one
// daemon; with disjoint partners at 0.98-1.06x). When a replica joins or
// leaves, only the partners it gains or loses move.
//
// Affinity is a preference, not a lock: a claim is still a RENAME, every
// write still carries its fencing token, and for a moment around a change
// of replicas two may poll one partner, which is as safe as it always was.
// A replica counts as live while its intake_worker row is younger than its
// lease; a replica that stops retires its row at once, one that crashes is
// taken over by the others one lease later. A replica always counts itself
// live, and when it cannot read the others it polls: two pollers are safe,
// none would stall the partner.

// peerRefresh bounds how stale the view of the live replicas may be.
const peerRefresh = 2 * time.Second

// peerLostRefresh: after a lost claim the view is refreshed if it is at
// least this old.
const peerLostRefresh = 200 * time.Millisecond

// Config is what Peers needs.
type Config struct {
	Ledger   *ledger.Ledger
	WorkerID string
	Lease    time.Duration
	// Everyone: every replica polls every partner (affinity "none").
	Everyone bool
	// Registered reports whether this replica is recorded in
	// intake_worker (Start): without it, it polls every partner.
	Registered func() bool
	// Partners are this replica's partner ids now.
	Partners func() []string
	// Gained is told of each partner this replica polls since the last
	// view and did not under it: it is polled at once.
	Gained func(partner string)
	// Seen is told each view read (tests).
	Seen  func(serving map[string][]string)
	Owned *prometheus.GaugeVec // intake_partner_owned, by partner
	Log   *slog.Logger
}

// Peers caches which live replicas serve which partners.
type Peers struct {
	cfg Config
	mu  sync.Mutex // never held across a read of the database
	at  time.Time  // when the view was read (its read's start); zero: read it at the next question
	// serving: partner -> live replicas serving it (this one included);
	// nil before the first view and after a failed read (unknown)
	serving map[string][]string
	// last is the last view a read made, and lastAt when that read
	// began: what a read's gains are counted against, a failed read
	// between or not
	last   map[string][]string
	lastAt time.Time
	// reading is closed when the read in progress ends; nil when none is
	reading chan struct{}
	readAt  time.Time // when the read in progress began
	read    bool      // a read has ended with a view, or failed (unknown)
	// gen counts the requests for a new view (Expire, Lost): a read that
	// began before one does not count as fresh
	gen uint64
}

// New is a Peers that reads the live replicas at its first question.
func New(cfg Config) *Peers { return &Peers{cfg: cfg} }

// Lost notes a claim race lost: another replica claims from the partner,
// so the view of the live replicas is refreshed soon (not at every loss).
func (p *Peers) Lost() {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := p.at
	if p.reading != nil {
		seen = p.readAt // the read in progress sees the replicas as of its start
	}
	if time.Since(seen) > peerLostRefresh {
		p.at = time.Time{}
		p.gen++
	}
}

// Expire makes the next question read the live replicas again, as a
// third of a lease later would (tests).
func (p *Peers) Expire() {
	p.mu.Lock()
	p.at = time.Time{}
	p.gen++
	p.mu.Unlock()
}

// Owns reports whether this replica polls the partner now. Without Start
// (PollOnce, `intake run --once`) there is no registration, and with
// affinity "none" every replica polls every partner: it always does.
func (p *Peers) Owns(ctx context.Context, partner string) bool {
	if !p.cfg.Registered() || p.cfg.Everyone {
		return true
	}
	serving := p.view(ctx)
	if serving == nil {
		// the others are unknown: two pollers are safe, none would stall
		// the partner
		p.cfg.Owned.WithLabelValues(partner).Set(1)
		return true
	}
	workers := append([]string{p.cfg.WorkerID}, serving[partner]...)
	mine := rendezvous.Owner(partner, workers) == p.cfg.WorkerID
	v := 0.0
	if mine {
		v = 1
	}
	p.cfg.Owned.WithLabelValues(partner).Set(v)
	return mine
}

// view is the view of the live replicas, read again once it is older
// than a third of a lease (at most peerRefresh). One question at a time
// reads it, outside the lock; the others meanwhile are answered from the
// view before, so no partner's poll gate (nor a claim's Lost) waits on
// another's read. Only before the first view, and when the view before
// is older than a lease (the replica was paused), do they wait for the
// read; when that read is cut short by its own asker's end, the first of
// them reads it.
func (p *Peers) view(ctx context.Context) map[string][]string {
	p.mu.Lock()
	for {
		if !p.at.IsZero() && time.Since(p.at) <= min(peerRefresh, p.cfg.Lease/3) {
			defer p.mu.Unlock()
			return p.serving
		}
		wait := p.reading
		if wait == nil {
			break
		}
		if p.read && (p.serving == nil || time.Since(p.lastAt) < p.cfg.Lease) {
			// the view before, while it is younger than a lease; one
			// older (a replica paused past its lease, whose partners
			// others took over meanwhile) is not acted on: the question
			// waits for the read
			defer p.mu.Unlock()
			return p.serving
		}
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil
		}
		p.mu.Lock()
	}
	done := make(chan struct{})
	began := time.Now()
	p.reading, p.readAt = done, began
	prev, gen := p.last, p.gen
	p.mu.Unlock()

	// bounded: the questions of a replica whose view is older than a
	// lease wait for this read
	rctx, cancel := context.WithTimeout(ctx, readWait(p.cfg.Lease))
	serving, err := p.cfg.Ledger.LiveServing(rctx)
	cancel()
	var gained []string
	if err == nil && prev != nil {
		// the partners this view gives this replica that the last did not
		// (a replica gone: its lease ran out) are polled at once, not at
		// their next turn: a failover costs the lease, not the lease and a
		// poll interval
		gained = newlyOwned(p.cfg.WorkerID, p.cfg.Partners(), prev, serving)
	}
	p.mu.Lock()
	p.reading = nil
	close(done)
	switch {
	case err == nil:
		// dated by the read's start: a pause between the read and here
		// does not make it younger than it is
		p.serving, p.at, p.read = serving, began, true
		p.last, p.lastAt = serving, began
		if p.gen != gen {
			// Expire or Lost during the read asked for a view younger
			// than this one's start: the next question reads again
			p.at = time.Time{}
		}
	case ctx.Err() != nil:
		// the asker's own end: no view, and the next question reads it
		serving = p.serving
	default:
		// a failed read is tried again after the same interval, not at
		// every question (nor at every lost claim meanwhile)
		p.serving, p.at, p.read, serving = nil, time.Now(), true, nil
	}
	p.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		p.cfg.Log.Warn("reading the live replicas failed; polling every partner meanwhile", "err", err)
	}
	for _, id := range gained {
		p.cfg.Gained(id)
	}
	if p.cfg.Seen != nil && (err == nil || ctx.Err() == nil) {
		p.cfg.Seen(serving)
	}
	return serving
}

// readWait bounds a read of the live replicas: a third of the lease (a
// read that fails is as good as none: every partner is polled
// meanwhile, and it is read again after the refresh interval).
func readWait(lease time.Duration) time.Duration {
	return max(lease/3, time.Second)
}

// newlyOwned lists the partners of ids that me polls under the live
// replicas now (a partner -> serving replicas view, LiveServing's) and
// did not under prev.
func newlyOwned(me string, ids []string, prev, now map[string][]string) []string {
	var out []string
	for _, id := range ids {
		if slices.Equal(prev[id], now[id]) {
			continue
		}
		if rendezvous.Owner(id, append([]string{me}, now[id]...)) == me && rendezvous.Owner(id, append([]string{me}, prev[id]...)) != me {
			out = append(out, id)
		}
	}
	return out
}
