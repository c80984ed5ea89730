package intake

import (
	"context"
	"slices"
	"sync"
	"time"

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

// peers caches which live replicas serve which partners.
type peers struct {
	mu      sync.Mutex
	at      time.Time
	serving map[string][]string // partner -> live replicas serving it (this one included)
}

// lost notes a claim race lost: another replica claims from the partner, so
// the view of the live replicas is refreshed soon (not at every loss).
func (p *peers) lost() {
	p.mu.Lock()
	if since := time.Since(p.at); since > peerLostRefresh {
		p.at = time.Time{}
	}
	p.mu.Unlock()
}

// peerLostRefresh: after a lost claim the view is refreshed if it is at
// least this old.
const peerLostRefresh = 200 * time.Millisecond

// owns reports whether this replica polls the partner now. Without Start
// (PollOnce, `intake run --once`) there is no registration, and with
// affinity "none" every replica polls every partner: it always does.
func (d *Daemon) owns(ctx context.Context, partner string) bool {
	if !d.registered.Load() || d.cfg.Affinity == AffinityNone {
		return true
	}
	d.peers.mu.Lock()
	defer d.peers.mu.Unlock()
	refresh := min(peerRefresh, d.cfg.Lease/3)
	if d.peers.at.IsZero() || time.Since(d.peers.at) > refresh {
		serving, err := d.ledger.LiveServing(ctx)
		d.peers.at = time.Now() // a failed read is tried again after the same interval, not at every call
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("reading the live replicas failed; polling every partner meanwhile", "err", err)
			}
			d.peers.serving = nil
		} else {
			// the partners this view gives this replica that the last did
			// not (a replica gone: its lease ran out) are polled at once,
			// not at their next turn: a failover costs the lease, not the
			// lease and a poll interval
			if prev := d.peers.serving; prev != nil {
				for _, id := range newlyOwned(d.cfg.WorkerID, d.parts.ids(), prev, serving) {
					if p, ok := d.parts.get(id); ok {
						p.poke()
					}
				}
			}
			d.peers.serving = serving
		}
		d.signals.Peers.Signal(d.peers.serving)
	}
	if d.peers.serving == nil {
		return true // the others are unknown: two pollers are safe, none would stall the partner
	}
	workers := append([]string{d.cfg.WorkerID}, d.peers.serving[partner]...)
	mine := rendezvous.Owner(partner, workers) == d.cfg.WorkerID
	v := 0.0
	if mine {
		v = 1
	}
	d.metrics.partnerOwned.WithLabelValues(partner).Set(v)
	return mine
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

// notPolling forgets what this replica's polls saw of a partner another
// replica polls now: its up, ready-files and oldest-ready gauges would
// otherwise go stale here and mask (or fake) the owner's alerts, which
// aggregate with max() over replicas.
func (d *Daemon) notPolling(p *partnerRT) {
	p.statMu.Lock()
	p.polling, p.elsewhere, p.readyCount, p.oldestReady = false, true, 0, time.Time{}
	p.statMu.Unlock()
	d.metrics.partnerUp.DeleteLabelValues(p.cfg.ID)
	d.metrics.readyFiles.DeleteLabelValues(p.cfg.ID)
	d.metrics.oldestReady.DeleteLabelValues(p.cfg.ID)
}
