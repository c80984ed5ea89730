package reconcile

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

type entryInfo struct {
	name string
	at   time.Time
}

func (e entryInfo) Name() string       { return e.name }
func (e entryInfo) Size() int64        { return 0 }
func (e entryInfo) Mode() fs.FileMode  { return 0o644 }
func (e entryInfo) ModTime() time.Time { return e.at }
func (e entryInfo) IsDir() bool        { return false }
func (e entryInfo) Sys() any           { return nil }

// The entries of ready/ the reconciler reports are kept bounded while the
// listing runs: whatever order the site lists them in, the oldest (by
// time, then name) are kept, oldest first, and the others counted.
func TestOldestEntriesKeepsTheOldestAndCountsTheRest(t *testing.T) {
	base := time.Now()
	var all []partners.Skipped
	for i := range 1000 {
		// pairs of entries of one time: the name decides
		all = append(all, partners.Skipped{Info: entryInfo{fmt.Sprintf("e%04d", i), base.Add(time.Duration(i/2) * time.Second)}})
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3 {
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		o := &oldestEntries{max: 100}
		for _, sk := range all {
			o.push(sk)
		}
		got := o.sorted()
		if len(got) != 100 || o.dropped != 900 {
			t.Fatalf("kept %d and dropped %d, want 100 and 900", len(got), o.dropped)
		}
		for i, sk := range got {
			if want := fmt.Sprintf("e%04d", i); sk.Info.Name() != want {
				t.Fatalf("kept[%d] = %s, want %s", i, sk.Info.Name(), want)
			}
		}
	}
}
