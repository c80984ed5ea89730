package intake

import (
	"time"
)

// Which replica polls a partner is intake/affinity's (Daemon.peers).

// notPolling forgets what this replica's polls saw of a partner another
// replica polls now: its up, ready-files and oldest-ready gauges would
// otherwise go stale here and mask (or fake) the owner's alerts, which
// aggregate with max() over replicas.
func (p *partnerRT) notPolling(m *metrics) {
	p.statMu.Lock()
	p.polling, p.elsewhere, p.readyCount, p.oldestReady = false, true, 0, time.Time{}
	p.statMu.Unlock()
	m.partnerUp.DeleteLabelValues(p.cfg.ID)
	m.readyFiles.DeleteLabelValues(p.cfg.ID)
	m.oldestReady.DeleteLabelValues(p.cfg.ID)
}
