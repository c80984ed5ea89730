// Package backpressure is the spool's backpressure on claims: the
// free-space floor of the spool's disk (every partner's claims wait below
// it: Guard.SpaceOK) and each partner's spool quota (its own claims wait:
// Quota). Either resumes by itself when there is room again; it sets
// their gauges and logs each change. What waits is the pipeline's poll
// (intake/poll.go).
package backpressure

import (
	"log/slog"
	"sync/atomic"

	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/spool"
)

// Guard is the spool's backpressure.
type Guard struct {
	Spool   *spool.Spool
	MinFree *int64 // the daemon's Config.SpoolMinFree (changed by tests at run time)
	Metrics *metrics.Set
	Log     *slog.Logger
	low     atomic.Bool
}

// SpaceOK applies spool backpressure: below the free-space floor no new
// file is claimed; claiming resumes by itself when space returns.
func (g *Guard) SpaceOK() bool {
	free, err := g.Spool.FreeBytes()
	if err != nil {
		g.Log.Error("spool free space unknown; not claiming", "err", err)
		return false
	}
	g.Metrics.SpoolFree.Set(float64(free))
	low := free < uint64(*g.MinFree)
	if was := g.low.Swap(low); was != low {
		if low {
			g.Log.Warn("spool disk below its free-space floor: claiming paused", "free_bytes", free, "min_free_bytes", *g.MinFree)
		} else {
			g.Log.Info("spool disk has room again: claiming resumed", "free_bytes", free)
		}
	}
	if low {
		g.Metrics.Backpressure.Set(1)
	} else {
		g.Metrics.Backpressure.Set(0)
	}
	return !low
}

// Quota is a partner's spool quota at the start of a poll's claims: the
// bytes it holds, to which the files the poll resumed and has yet to
// download, then each claim, add their listed size. While they
// are at or over limits.max_spool_bytes none of its files is claimed
// (backpressure for this partner alone: the others go on); resumes of its
// claimed files go on, and a file is never refused for its own size (one
// claim may go over, so a file larger than the quota still moves).
type Quota struct {
	// Max is limits.max_spool_bytes (0: none), Used the bytes the
	// partner's spool holds and its claims since add (read them only).
	Max, Used int64
	g         *Guard
	partner   string
	full      *atomic.Bool
}

// Quota is partner's spool quota (max: limits.max_spool_bytes, 0 for
// none) at the start of a poll's claims; full is the partner's state,
// kept from poll to poll.
func (g *Guard) Quota(partner string, max int64, full *atomic.Bool) (*Quota, error) {
	q := &Quota{g: g, partner: partner, full: full, Max: max}
	if q.Max > 0 {
		used, err := g.Spool.Usage(partner)
		if err != nil {
			return nil, err
		}
		q.Used = used
	}
	q.state(q.OK())
	return q, nil
}

// OK reports whether the partner's claims may go on.
func (q *Quota) OK() bool { return q.Max <= 0 || q.Used < q.Max }

// Claimed counts a claim's listed bytes against the quota.
func (q *Quota) Claimed(size int64) {
	q.Used += size
	if !q.OK() {
		q.state(false)
	}
}

// state logs a change of the partner's quota state and sets its gauge.
func (q *Quota) state(ok bool) {
	v := 0.0
	if !ok {
		v = 1
	}
	q.g.Metrics.QuotaFull.WithLabelValues(q.partner).Set(v)
	if was := q.full.Swap(!ok); was != !ok {
		if !ok {
			q.g.Log.Warn("partner's spool quota reached: its claims paused", "partner", q.partner, "max_spool_bytes", q.Max)
		} else {
			q.g.Log.Info("partner's spool back under its quota: claims resumed", "partner", q.partner)
		}
	}
}
