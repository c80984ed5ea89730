package bench

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// A repeated workload's figures are the medians of its runs' (each ratio
// the median of the runs' own ratios, not a ratio of medians), its CPU
// by process the median of each process's, its counts the first run's,
// and its runs are kept.
func TestARepeatedWorkloadReportsMediansAndKeepsItsRuns(t *testing.T) {
	run := func(s, floor float64, cpu float64) *Results {
		return &Results{PGPBytes: 7, PGPRows: 3, PGPS: s, PGPFloorS: floor, PGPRatioFloor: s / floor, PGPPeakRSSMiB: s * 10,
			PGPCPUS: map[string]float64{"intake": cpu}, PGPFloorCPUS: map[string]float64{"postgres": 2 * cpu}}
	}
	runs := []*Results{run(10, 8, 5), run(9, 10, 7), run(12, 11, 6)}
	res := &Results{}
	pgpRepeated.merge(res, runs)
	if res.PGPS != 10 || res.PGPFloorS != 10 || res.PGPPeakRSSMiB != 100 {
		t.Fatalf("medians: %v s, floor %v s, RSS %v", res.PGPS, res.PGPFloorS, res.PGPPeakRSSMiB)
	}
	if want := 12.0 / 11; res.PGPRatioFloor != want {
		t.Fatalf("ratio %v, want the median of the runs' ratios %v", res.PGPRatioFloor, want)
	}
	if res.PGPCPUS["intake"] != 6 || res.PGPFloorCPUS["postgres"] != 12 {
		t.Fatalf("CPU %v / %v", res.PGPCPUS, res.PGPFloorCPUS)
	}
	if res.PGPBytes != 7 || res.PGPRows != 3 || len(res.PGPRuns) != 3 {
		t.Fatalf("counts %d / %d, %d runs kept", res.PGPBytes, res.PGPRows, len(res.PGPRuns))
	}
	one := &Results{}
	rejectsRepeated.merge(one, []*Results{{RejectsRows: 5, RejectsRatio: 1.2}})
	if one.RejectsRatio != 1.2 || one.RejectsRows != 5 || one.RejectsRuns != nil {
		t.Fatalf("one run: %+v", one)
	}
}

// Every figure of a repeated workload (its float fields) is one its
// medians are taken of: a figure left out would read 0 in the results.
func TestARepeatedWorkloadTakesTheMedianOfEveryFigure(t *testing.T) {
	for _, w := range []struct {
		r        *repeated
		prefixes []string
	}{{modesRepeated, []string{"Snapshot", "Plan"}}, {pgpRepeated, []string{"PGP"}}, {rejectsRepeated, []string{"Rejects"}}} {
		r := &Results{}
		for _, f := range w.r.figures {
			*f(r) = 1
		}
		v := reflect.ValueOf(r).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			if v.Field(i).Kind() != reflect.Float64 || !slices.ContainsFunc(w.prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
				continue
			}
			if v.Field(i).Float() != 1 {
				t.Errorf("%s: no median taken", name)
			}
		}
	}
}
