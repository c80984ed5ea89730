package sessions

import "github.com/prometheus/client_golang/prometheus"

// noGauge is a gauge nobody reads.
type noGauge struct{ prometheus.Gauge }

func (noGauge) Set(float64) {}
