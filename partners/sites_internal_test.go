package partners

import (
	"fmt"
	"math/rand"
	"testing"
)

// The sorted check (sitesCollide) finds a collision exactly when the
// pairwise comparison does, over random sites, roots, directories and
// shared_site flags (nested, equal, relative, absolute, ".").
func TestSitesCollideAgreesWithThePairwiseCheck(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	roots := []string{"/d", "/d/", "/d/a", "/d/a/b", "/d-x", "/e", "d", "."}
	dirs := []string{"ready", "incoming", "a", "a/ready", "b", "archive/x", "x/../ready", "."}
	pick := func(v []string) string { return v[rng.Intn(len(v))] }
	collisions := 0
	for round := 0; round < 20000; round++ {
		n := 2 + rng.Intn(4)
		ps := make([]Config, n)
		keys := make([]string, n)
		for i := range ps {
			ps[i] = Config{ID: fmt.Sprint(i), SharedSite: rng.Intn(2) == 0,
				SFTP: SFTP{Address: pick([]string{"h:22", "H:22", "g:22"}), User: "u", Root: pick(roots)},
				Dirs: Dirs{Incoming: pick(dirs), Ready: pick(dirs), Processing: pick(dirs), Archive: pick(dirs), Quarantine: pick(dirs), Reports: pick(dirs)}}
			if rng.Intn(3) > 0 { // mostly well-separated directories
				ps[i].Dirs = Dirs{Incoming: "in", Ready: "ready", Processing: "proc", Archive: "arch", Quarantine: "q", Reports: "rep"}
			}
			keys[i] = fmt.Sprintf("partners[%d]", i)
		}
		pair := checkSitesPairwise(ps, keys) != nil
		if pair {
			collisions++
		}
		if got := sitesCollide(ps); got != pair {
			t.Fatalf("round %d: sorted check %v, pairwise %v for %+v", round, got, pair, ps)
		}
	}
	if collisions == 0 || collisions == 20000 {
		t.Fatalf("%d of 20000 rounds collided: the cases do not cover both outcomes", collisions)
	}
}
