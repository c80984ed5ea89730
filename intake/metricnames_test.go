package intake_test

import (
	"context"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The families renamed to Prometheus's conventions are exported under
// their new names and, one more release, under the old ones with the same
// series and values and help "Deprecated: use <new>. …"; no other family
// carries a unit anywhere but last (before _total) or ends in _done.
func TestRenamedMetricsKeepTheirOldNamesOneRelease(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "names")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("N", 5))
	// the in-flight gauges have series while a file applies: read them
	// with the file stopped in its chunk's transaction
	resume := r.pollPaused("names", "apply:mid_chunk")
	if err := r.d.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	series := func(f *dto.MetricFamily) map[string]float64 {
		out := map[string]float64{}
		for _, m := range f.Metric {
			var key []string
			for _, l := range m.Label {
				key = append(key, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if f.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			out[strings.Join(key, ",")] = v
		}
		return out
	}
	for old, cur := range map[string]string{
		"intake_bytes_downloaded_total": "intake_downloaded_bytes_total",
		"intake_inflight_rows_done":     "intake_inflight_committed_rows",
		"intake_inflight_bytes_done":    "intake_inflight_committed_bytes",
	} {
		o, c := byName[old], byName[cur]
		if c == nil || o == nil {
			t.Fatalf("%s: %v, %s (its old name): %v", cur, c != nil, old, o != nil)
		}
		if want := "Deprecated: use " + cur + ". " + c.GetHelp(); o.GetHelp() != want {
			t.Errorf("%s help %q, want %q", old, o.GetHelp(), want)
		}
		if o.GetType() != c.GetType() {
			t.Errorf("%s is a %s, %s a %s", old, o.GetType(), cur, c.GetType())
		}
		os, cs := series(o), series(c)
		if len(cs) == 0 || len(os) != len(cs) {
			t.Errorf("%s has %d series, %s %d", old, len(os), cur, len(cs))
		}
		for k, v := range cs {
			if ov, ok := os[k]; !ok || ov != v {
				t.Errorf("%s{%s} = %v, %s{%s} = %v (present %v)", cur, k, v, old, k, ov, ok)
			}
		}
	}
	if v := series(byName["intake_downloaded_bytes_total"])["partner=names"]; v <= 0 {
		t.Errorf("intake_downloaded_bytes_total{partner=names} = %v after a file was downloaded", v)
	}
	for name, f := range byName {
		if strings.HasPrefix(f.GetHelp(), "Deprecated:") {
			continue
		}
		base := strings.TrimSuffix(name, "_total")
		for _, unit := range []string{"_bytes", "_seconds"} {
			if strings.Contains(base, unit+"_") && !strings.HasSuffix(base, unit) {
				t.Errorf("%s: the unit %s is not last", name, unit)
			}
		}
		if strings.HasSuffix(name, "_done") {
			t.Errorf("%s: ends in _done, not a unit", name)
		}
	}
}
