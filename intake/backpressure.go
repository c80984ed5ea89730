package intake

import (
	"log/slog"
	"sync/atomic"

	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/spool"
)

// spoolGuard is the spool's backpressure: the free-space floor of the
// spool's disk (all partners' claims wait below it) and each partner's
// spool quota (its own claims wait).
type spoolGuard struct {
	spool   *spool.Spool
	minFree *int64 // the daemon's Config.SpoolMinFree (SetSpoolMinFree)
	low     atomic.Bool
	metrics *metrics.Set
	log     *slog.Logger
}

// spaceOK applies spool backpressure: below the free-space floor no new
// file is claimed; claiming resumes by itself when space returns.
func (g *spoolGuard) spaceOK() bool {
	free, err := g.spool.FreeBytes()
	if err != nil {
		g.log.Error("spool free space unknown; not claiming", "err", err)
		return false
	}
	g.metrics.SpoolFree.Set(float64(free))
	low := free < uint64(*g.minFree)
	if was := g.low.Swap(low); was != low {
		if low {
			g.log.Warn("spool disk below its free-space floor: claiming paused", "free_bytes", free, "min_free_bytes", *g.minFree)
		} else {
			g.log.Info("spool disk has room again: claiming resumed", "free_bytes", free)
		}
	}
	if low {
		g.metrics.Backpressure.Set(1)
	} else {
		g.metrics.Backpressure.Set(0)
	}
	return !low
}

// spoolQuota is a partner's spool quota at the start of a poll's claims:
// the bytes it holds, to which each claim adds its listed size. While they
// are at or over limits.max_spool_bytes none of its files is claimed
// (backpressure for this partner alone: the others go on); resumes of its
// claimed files go on, and a file is never refused for its own size (one
// claim may go over, so a file larger than the quota still moves).
type spoolQuota struct {
	max, used int64
}

// quota is the partner's spool quota at the start of a poll's claims.
func (g *spoolGuard) quota(p *partnerRT) (*spoolQuota, error) {
	q := &spoolQuota{max: p.cfg.Limits.MaxSpoolBytes}
	if q.max > 0 {
		used, err := g.spool.Usage(p.cfg.ID)
		if err != nil {
			return nil, err
		}
		q.used = used
	}
	g.quotaState(p, q.ok())
	return q, nil
}

func (q *spoolQuota) ok() bool { return q.max <= 0 || q.used < q.max }

// claimed counts a claim's listed bytes against the quota and reports
// whether claiming may go on.
func (g *spoolGuard) quotaClaimed(p *partnerRT, q *spoolQuota, size int64) {
	q.used += size
	if !q.ok() {
		g.quotaState(p, false)
	}
}

// quotaState logs a change of the partner's quota state and sets its gauge.
func (g *spoolGuard) quotaState(p *partnerRT, ok bool) {
	v := 0.0
	if !ok {
		v = 1
	}
	g.metrics.QuotaFull.WithLabelValues(p.cfg.ID).Set(v)
	if was := p.quotaFull.Swap(!ok); was != !ok {
		if !ok {
			g.log.Warn("partner's spool quota reached: its claims paused", "partner", p.cfg.ID, "max_spool_bytes", p.cfg.Limits.MaxSpoolBytes)
		} else {
			g.log.Info("partner's spool back under its quota: claims resumed", "partner", p.cfg.ID)
		}
	}
}
