package siteindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

// The site index finds exactly the sites partners.SiteOverlaps says
// overlap, on every pair of a few hundred sites drawn from nested roots,
// two servers and two accounts, each put, some put again under another
// root.
func TestTheSiteIndexFindsWhatSiteOverlapsSays(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	roots := []string{"/", "/a", "/a/b", "/a/b/c", "/a/bc", "/ab", "/x/y", "/x", "a", "a/b", "."}
	var x Index
	sites := map[string]partners.Site{}
	for i := range 300 {
		id := fmt.Sprintf("p%d", rng.IntN(200))
		s := partners.Site{HostKey: []string{"k1", "k2", ""}[rng.IntN(3)], User: []string{"u", "v"}[rng.IntN(2)], Root: roots[rng.IntN(len(roots))]}
		if i%7 == 0 {
			s.Root = fmt.Sprintf("/a/b/%d", rng.IntN(5))
		}
		x.Put(id, s)
		sites[id] = s
	}
	for id, s := range sites {
		var want []string
		for other, o := range sites {
			if other != id && partners.SiteOverlaps(s, o) {
				want = append(want, other)
			}
		}
		slices.Sort(want)
		if got := x.Overlapping(id, s); !slices.Equal(got, want) {
			t.Fatalf("%s %+v: index found %v, SiteOverlaps %v", id, s, got, want)
		}
	}
}
