package affinity

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

// When a replica's lease runs out, the survivors' next view of the live
// replicas names the partners each now polls that it did not: exactly
// those the gone replica owned and the rendezvous gives it (they are
// polled at once, not at their next turn); nothing when the view is the
// same, and nothing that stays with another live replica.
func TestTheViewAfterAReplicaIsGoneNamesThePartnersEachSurvivorTakes(t *testing.T) {
	var ids []string
	three, two := map[string][]string{}, map[string][]string{}
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("partner-%03d", i)
		ids = append(ids, id)
		three[id] = []string{"node-a", "node-b", "node-c"}
		two[id] = []string{"node-a", "node-c"}
	}
	if got := newlyOwned("node-a", ids, three, three); len(got) != 0 {
		t.Fatalf("the same view gave node-a %v", got)
	}
	taken := map[string]string{}
	for _, me := range []string{"node-a", "node-c"} {
		for _, id := range newlyOwned(me, ids, three, two) {
			if rendezvous.Owner(id, three[id]) != "node-b" {
				t.Fatalf("%s took %s from %s, which is still live", me, id, rendezvous.Owner(id, three[id]))
			}
			if taken[id] != "" {
				t.Fatalf("%s taken by %s and %s", id, taken[id], me)
			}
			taken[id] = me
		}
	}
	for _, id := range ids {
		if rendezvous.Owner(id, three[id]) == "node-b" && taken[id] == "" {
			t.Fatalf("%s, node-b's, taken by no survivor", id)
		}
	}
	if len(taken) < 70 {
		t.Fatalf("the survivors took %d partners of 300, want about a third", len(taken))
	}
}
