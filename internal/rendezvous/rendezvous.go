// Package rendezvous picks which replica owns a key (under affinity
// "partner", which replica polls a partner): rendezvous hashing over the
// live workers, the same answer on every replica that sees the same set.
package rendezvous

import "hash/fnv"

// Owner picks the replica that polls a partner: highest rendezvous weight,
// ties to the smaller id. Duplicates in workers are harmless.
func Owner(partner string, workers []string) string {
	best, bestW := "", uint64(0)
	for _, w := range workers {
		h := fnv.New64a()
		h.Write([]byte(w))
		h.Write([]byte{0})
		h.Write([]byte(partner))
		x := mix(h.Sum64())
		if best == "" || x > bestW || (x == bestW && w < best) {
			best, bestW = w, x
		}
	}
	return best
}

// mix is splitmix64's finaliser: FNV alone spreads similar names poorly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
