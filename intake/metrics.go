package intake

import "github.com/partner-intake/partner-intake/intake/metrics"

// Metrics are the daemon's series for tests and the status command
// (intake/metrics).
type Metrics = metrics.Exposed

// Metrics returns the daemon's metric vectors.
func (d *Daemon) Metrics() Metrics { return d.metrics.Exposed() }

// countRows counts a chunk's rows by outcome, and the rows the target's
// state held, on m.
func countRows(m *metrics.Set, partner string, c chunkCounts) {
	m.RowsTotal.WithLabelValues(partner, "applied").Add(float64(c.applied))
	m.RowsTotal.WithLabelValues(partner, "unchanged").Add(float64(c.unchanged))
	m.RowsTotal.WithLabelValues(partner, "conflict").Add(float64(c.conflict))
	m.RowsTotal.WithLabelValues(partner, "rejected").Add(float64(c.rejected))
	if c.deleted > 0 {
		m.RowsTotal.WithLabelValues(partner, "deleted").Add(float64(c.deleted))
	}
	for reason, n := range map[string]int64{"outside_edit": c.outsideEdit + c.deleteKept, "exists": c.exists, "not_found": c.notFound} {
		if n > 0 {
			m.RowsHeld.WithLabelValues(partner, reason).Add(float64(n))
		}
	}
}
