package layers

import (
	"bytes"
	"os"
	"sort"
	"testing"
)

// maxShare is the largest share of the module's non-test Go lines one
// package may hold: a package past it holds more than one job.
const maxShare = 0.20

func TestNoPackageHoldsMoreThanAFifthOfTheCode(t *testing.T) {
	root := "../.."
	byDir := map[string]int{}
	total := 0
	forEachGoFile(t, root, func(p, dir string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(b, []byte("\n"))
		byDir[dir] += n
		total += n
	})
	if total < 10000 {
		t.Fatalf("%d lines of Go: not the module", total)
	}
	dirs := make([]string, 0, len(byDir))
	for d := range byDir {
		dirs = append(dirs, d)
	}
	sort.Slice(dirs, func(i, j int) bool { return byDir[dirs[i]] > byDir[dirs[j]] })
	for _, d := range dirs {
		if share := float64(byDir[d]) / float64(total); share > maxShare {
			t.Errorf("package %s holds %d of the module's %d non-test lines (%.1f%%, at most %.0f%%)", d, byDir[d], total, 100*share, 100*maxShare)
		}
	}
	t.Logf("largest: %s %d of %d lines (%.1f%%)", dirs[0], byDir[dirs[0]], total, 100*float64(byDir[dirs[0]])/float64(total))
}
