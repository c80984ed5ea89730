package intake

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/metrics"
)

// partnerSet is the daemon's partners: a reload swaps byID and order
// under mu (reload.go), which readers beside a reload take (list, ids,
// get).
type partnerSet struct {
	mu       sync.RWMutex
	byID     map[string]*partnerRT
	order    []string
	retiring []*partnerRT // removed or replaced by a reload, still finishing a poll
	// unlooked: a reload removed a partner whose processing dir could not
	// be looked through (its site did not answer after a failed poll):
	// the run is not drained, so a start with the partner configured
	// again looks there
	unlooked atomic.Bool
}

// list is the current partners in configuration order.
func (s *partnerSet) list() []*partnerRT {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.listLocked()
}

func (s *partnerSet) listLocked() []*partnerRT {
	out := make([]*partnerRT, len(s.order))
	for i, id := range s.order {
		out[i] = s.byID[id]
	}
	return out
}

// ids is the current partner ids in configuration order.
func (s *partnerSet) ids() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]string(nil), s.order...)
}

// get is the current runtime of a partner.
func (s *partnerSet) get(id string) (*partnerRT, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.byID[id]
	return p, ok
}

// retire ends a retired runtime once its last poll is over: its session
// is closed, Stop no longer waits for it, and a removed partner's gauges
// go (they would otherwise stay at their last values and feed alerts).
func (s *partnerSet) retire(p *partnerRT, m *metrics.Set, log *slog.Logger) {
	p.drop()
	s.mu.Lock()
	for i, r := range s.retiring {
		if r == p {
			s.retiring = append(s.retiring[:i], s.retiring[i+1:]...)
			break
		}
	}
	_, current := s.byID[p.cfg.ID]
	s.mu.Unlock()
	if current {
		return // replaced: its successor reports, and took its state over
	}
	for _, g := range []*prometheus.GaugeVec{m.PartnerUp, m.ReadyFiles, m.OldestReady, m.PartnerOwned, m.Files, m.OldestProcessing,
		m.QuarantineOpen, m.QuarantineOldest, m.InflightRows, m.InflightRowsDone, m.InflightBytes, m.InflightBytesDone, m.SpoolBytes, m.QuotaFull,
		m.Awaiting, m.AwaitingOldest, m.TargetHeld, m.LegacySSH} {
		g.DeletePartialMatch(prometheus.Labels{"partner": p.cfg.ID})
	}
	log.Info("partner removed by a reload: its poller ended", "partner", p.cfg.ID)
}
