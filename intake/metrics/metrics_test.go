package metrics

import (
	"time"

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
// (the oldest in processing is the oldest other file), open holds count
// every file held for a decision (quarantined or failed for good), files applying
// carry their progress, and a partner with no file left has no series of
// them (none for a partner that never had one).
func TestFilesGauges(t *testing.T) {
	m := New(prometheus.NewRegistry())
	m.SetFiles([]string{"p1", "p2"}, []ledger.Gauge{
		{Partner: "p1", State: ledger.StateApplying, Files: 1, Age: 20, Rows: 100, RowsDone: 40},
		{Partner: "p1", State: ledger.StateClaimed, Files: 3, Age: 10},
		{Partner: "p1", State: ledger.StateQuarantined, Files: 2, Age: 500},
		{Partner: "p1", State: ledger.StateAwaitingApproval, Files: 1, Age: 700},
	}, []ledger.HoldCount{{Partner: "p1", Files: 3, Oldest: 900 * time.Second}})
	for name, c := range map[string]struct {
		got  prometheus.Collector
		want float64
	}{
		"claimed":           {m.Files.WithLabelValues("p1", "claimed"), 3},
		"oldest processing": {m.OldestProcessing.WithLabelValues("p1"), 20},
		"quarantine open":   {m.QuarantineOpen.WithLabelValues("p1"), 3},
		"quarantine oldest": {m.QuarantineOldest.WithLabelValues("p1"), 900},
		"awaiting":          {m.Awaiting.WithLabelValues("p1"), 1},
		"awaiting oldest":   {m.AwaitingOldest.WithLabelValues("p1"), 700},
		"rows done":         {m.InflightRowsDone.WithLabelValues("p1"), 40},
	} {
		if v := testutil.ToFloat64(c.got); v != c.want {
			t.Errorf("%s = %v, want %v", name, v, c.want)
		}
	}
	for _, vec := range []*prometheus.GaugeVec{m.Files, m.OldestProcessing, m.QuarantineOpen, m.Awaiting, m.InflightRows} {
		if n := testutil.CollectAndCount(vec); n == 0 {
			t.Fatal("a gauge set above has no series")
		}
	}
	if n := testutil.CollectAndCount(m.Files); n != 3 {
		t.Errorf("intake_files has %d series, want p1's three states (none for p2)", n)
	}
	m.SetFiles([]string{"p1", "p2"}, []ledger.Gauge{{Partner: "p1", State: ledger.StateClaimed, Files: 1, Age: 5}}, nil)
	if n := testutil.CollectAndCount(m.Files); n != 1 {
		t.Errorf("intake_files has %d series after p1's other files left, want 1", n)
	}
	for _, vec := range []*prometheus.GaugeVec{m.QuarantineOpen, m.QuarantineOldest, m.Awaiting, m.AwaitingOldest, m.InflightRows, m.InflightRowsDone} {
		if n := testutil.CollectAndCount(vec); n != 0 {
			t.Errorf("a gauge of files that left still has %d series", n)
		}
	}
	if v := testutil.ToFloat64(m.OldestProcessing.WithLabelValues("p1")); v != 5 {
		t.Errorf("oldest processing = %v, want 5", v)
	}
	m.SetFiles([]string{"p1", "p2"}, nil, nil)
	if n := testutil.CollectAndCount(m.Files) + testutil.CollectAndCount(m.OldestProcessing); n != 0 {
		t.Errorf("%d series left for partners with no file", n)
	}
}
