package chunkrows

import (
	"math/rand/v2"
	"testing"
)

// A key set says a hash is there exactly when it was added before,
// through growth past the room it was made with, and after a reset; it
// yields each hash once. Hashes that differ only in their low bit are one
// (a collision: the SQL dedupe runs needlessly).
func TestAKeySetKnowsTheHashesAddedToIt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, room := range []int{0, 3, 1000} {
		k := newKeySet(room)
		for round := range 2 {
			want := map[uint64]bool{}
			for range 5000 {
				h := rng.Uint64() &^ 1
				if rng.IntN(4) == 0 && len(want) > 0 {
					for w := range want { // one added before
						h = w
						break
					}
				}
				if seen := k.Add(h); seen != want[h] {
					t.Fatalf("room %d, round %d: Add(%x) seen %v, want %v", room, round, h, seen, want[h])
				}
				want[h] = true
			}
			if k.Len() != len(want) {
				t.Fatalf("room %d: %d hashes, want %d", room, k.Len(), len(want))
			}
			got := map[uint64]bool{}
			for h := range k.All() {
				if got[h] || !want[h&^1] {
					t.Fatalf("room %d: All yields %x (again: %v)", room, h, got[h])
				}
				got[h] = true
			}
			if len(got) != len(want) {
				t.Fatalf("room %d: All yields %d hashes, want %d", room, len(got), len(want))
			}
			k.Reset()
			if k.Len() != 0 || k.Add(rng.Uint64()) {
				t.Fatalf("room %d: a reset set is not empty", room)
			}
			k.Reset()
		}
	}
	var k KeySet
	if k.Add(6) || !k.Add(7) || k.Len() != 1 {
		t.Fatal("hashes differing in their low bit are not one")
	}
}
