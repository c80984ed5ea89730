package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// deprecatedName exports a metric family once more under the name it had
// before a rename, for one release: every series of the current family,
// same labels and value, with help "Deprecated: use <current>. …", so
// that dashboards and alerts can move at their pace. docs/operations.md
// lists the renames and the release that drops the old names.
type deprecatedName struct {
	current prometheus.Collector
	desc    *prometheus.Desc
	kind    prometheus.ValueType
	labels  []string
}

// registerDeprecated registers old as an alias of current (named
// currentName) on reg. labels are current's variable labels.
func registerDeprecated(reg prometheus.Registerer, current prometheus.Collector, currentName, old, help string, kind prometheus.ValueType, labels ...string) {
	labels = append([]string(nil), labels...)
	sort.Strings(labels) // the order a written metric's labels come in
	reg.MustRegister(&deprecatedName{
		current: current,
		desc:    prometheus.NewDesc(old, "Deprecated: use "+currentName+". "+help, labels, nil),
		kind:    kind,
		labels:  labels,
	})
}

func (a *deprecatedName) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

func (a *deprecatedName) Collect(ch chan<- prometheus.Metric) {
	in := make(chan prometheus.Metric)
	go func() { a.current.Collect(in); close(in) }()
	for m := range in {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			ch <- prometheus.NewInvalidMetric(a.desc, err)
			continue
		}
		values := make([]string, 0, len(pb.Label))
		for _, l := range pb.Label { // sorted by name
			values = append(values, l.GetValue())
		}
		v := pb.GetGauge().GetValue()
		if a.kind == prometheus.CounterValue {
			v = pb.GetCounter().GetValue()
		}
		ch <- prometheus.MustNewConstMetric(a.desc, a.kind, v, values...)
	}
}
