package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A renamed family is gathered under its old name too, as the same kind,
// with the current family's series and values and "Deprecated: use
// <current>. " before its help.
func TestDeprecatedNamesCarryTheCurrentSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	m.BytesDownloaded.WithLabelValues("p1").Add(7)
	m.InflightRowsDone.WithLabelValues("p2").Set(3)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, c := range []struct {
		old, cur, partner string
		kind              dto.MetricType
		want              float64
	}{
		{"intake_bytes_downloaded_total", "intake_downloaded_bytes_total", "p1", dto.MetricType_COUNTER, 7},
		{"intake_inflight_rows_done", "intake_inflight_committed_rows", "p2", dto.MetricType_GAUGE, 3},
	} {
		o, cur := byName[c.old], byName[c.cur]
		if o == nil || cur == nil {
			t.Fatalf("%s gathered %v, %s %v", c.old, o != nil, c.cur, cur != nil)
		}
		if want := "Deprecated: use " + c.cur + ". " + cur.GetHelp(); o.GetHelp() != want || o.GetType() != c.kind {
			t.Errorf("%s: help %q type %v, want %q %v", c.old, o.GetHelp(), o.GetType(), want, c.kind)
		}
		if len(o.Metric) != 1 || o.Metric[0].Label[0].GetValue() != c.partner {
			t.Fatalf("%s: series %v, want one of partner %s", c.old, o.Metric, c.partner)
		}
		v := o.Metric[0].GetGauge().GetValue()
		if c.kind == dto.MetricType_COUNTER {
			v = o.Metric[0].GetCounter().GetValue()
		}
		if v != c.want {
			t.Errorf("%s = %v, want %v", c.old, v, c.want)
		}
	}
}
