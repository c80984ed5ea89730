package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/partner-intake/partner-intake/intake/ledger"
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

// The files gauges: quarantined and awaiting files are not "processing"
// (the oldest in processing is the oldest other file), files applying
// carry their progress, and a reset partner reads 0 until set again.
func TestFilesGauges(t *testing.T) {
	m := New(prometheus.NewRegistry())
	m.ResetFiles([]string{"p1"})
	m.SetFiles([]ledger.Gauge{
		{Partner: "p1", State: ledger.StateApplying, Files: 1, Age: 20, Rows: 100, RowsDone: 40},
		{Partner: "p1", State: ledger.StateClaimed, Files: 3, Age: 10},
		{Partner: "p1", State: ledger.StateQuarantined, Files: 2, Age: 500},
		{Partner: "p1", State: ledger.StateAwaitingApproval, Files: 1, Age: 700},
	})
	for name, c := range map[string]struct {
		got  prometheus.Collector
		want float64
	}{
		"claimed":           {m.Files.WithLabelValues("p1", "claimed"), 3},
		"oldest processing": {m.OldestProcessing.WithLabelValues("p1"), 20},
		"quarantine open":   {m.QuarantineOpen.WithLabelValues("p1"), 2},
		"quarantine oldest": {m.QuarantineOldest.WithLabelValues("p1"), 500},
		"awaiting":          {m.Awaiting.WithLabelValues("p1"), 1},
		"awaiting oldest":   {m.AwaitingOldest.WithLabelValues("p1"), 700},
		"rows done":         {m.InflightRowsDone.WithLabelValues("p1"), 40},
	} {
		if v := testutil.ToFloat64(c.got); v != c.want {
			t.Errorf("%s = %v, want %v", name, v, c.want)
		}
	}
	m.ResetFiles([]string{"p1"})
	if v := testutil.ToFloat64(m.Files.WithLabelValues("p1", "claimed")); v != 0 {
		t.Errorf("claimed after a reset = %v", v)
	}
}
