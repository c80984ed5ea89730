package intake

import (
	"fmt"
	"testing"

	"github.com/partner-intake/partner-intake/internal/rendezvous"
)

func TestOwnerIsStableSpreadAndMovesOnlyWhatItMust(t *testing.T) {
	var parts []string
	for i := 0; i < 200; i++ {
		parts = append(parts, fmt.Sprintf("partner-%03d", i))
	}
	count := map[string]int{}
	for _, p := range parts {
		o := rendezvous.Owner(p, []string{"node-a", "node-b"})
		if o != rendezvous.Owner(p, []string{"node-b", "node-a", "node-b"}) {
			t.Fatalf("%s: the owner depends on the order or repeats of the replicas", p)
		}
		count[o]++
	}
	if count["node-a"] < 70 || count["node-b"] < 70 {
		t.Fatalf("200 partners over two replicas split %v", count)
	}
	// a third replica takes some partners; every partner that stays with a
	// or b stays with the same one, and removing c again restores all
	moved := 0
	for _, p := range parts {
		two, three := rendezvous.Owner(p, []string{"node-a", "node-b"}), rendezvous.Owner(p, []string{"node-a", "node-b", "node-c"})
		if three != "node-c" && three != two {
			t.Fatalf("%s moved from %s to %s although %s is still there", p, two, three, two)
		}
		if three == "node-c" {
			moved++
		}
	}
	if moved < 40 || moved > 95 {
		t.Fatalf("a third replica took %d of 200 partners, want about a third", moved)
	}
	if rendezvous.Owner("p", []string{"only"}) != "only" {
		t.Fatal("a single replica does not own its partner")
	}
}
