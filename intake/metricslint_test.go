package intake_test

import (
	"bytes"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The daemon's /metrics, after a poll that landed a file, a held file and
// a duplicate (so every labelled family has series), passes `promtool
// check metrics`: names, units, suffixes and help as Prometheus's own
// linter wants them. promtool comes from .ci/promtool.sh (Debian's
// package as root, else built).
func TestTheDaemonsMetricsPassPromtool(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "lint")
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("L", 3))
	r.poll("lint")
	site.Drop(t, "orders-1.csv", goodRows("L", 3))
	site.Drop(t, "orders-2.csv", header+"bad,line\n")
	r.poll("lint")
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&text, f); err != nil {
			t.Fatal(err)
		}
	}
	out, err := osexec.Command("bash", "../.ci/promtool.sh").Output()
	if err != nil {
		t.Fatalf("promtool: %v", err)
	}
	cmd := osexec.Command(strings.TrimSpace(string(out)), "check", "metrics")
	cmd.Stdin = &text
	res, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, res)
	}
}
