package intake

import (
	"time"

	"github.com/partner-intake/partner-intake/intake/metrics"
)

// Which replica polls a partner is intake/affinity's (Daemon.peers).

// notPolling forgets what this replica's polls saw of a partner another
// replica polls now: its up, ready-files and oldest-ready gauges would
// otherwise go stale here and mask (or fake) the owner's alerts, which
// aggregate with max() over replicas.
func (p *partnerRT) notPolling(m *metrics.Set) {
	p.statMu.Lock()
	p.polling, p.elsewhere, p.readyCount, p.oldestReady = false, true, 0, time.Time{}
	p.statMu.Unlock()
	m.PartnerUp.DeleteLabelValues(p.cfg.ID)
	m.ReadyFiles.DeleteLabelValues(p.cfg.ID)
	m.OldestReady.DeleteLabelValues(p.cfg.ID)
}
