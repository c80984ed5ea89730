package partners_test

import (
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

type entry struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func (e entry) Name() string       { return e.name }
func (e entry) Size() int64        { return 10 }
func (e entry) Mode() fs.FileMode  { return e.mode }
func (e entry) ModTime() time.Time { return e.mtime }
func (e entry) IsDir() bool        { return e.mode.IsDir() }
func (e entry) Sys() any           { return nil }

// Every rule of ready/ gives its reason, claimable files come oldest
// first, and a data file is claimable in manifest mode only beside a
// regular manifest.
func TestClassifyReadyGivesEachEntryItsReason(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Minute) }
	for _, tc := range []struct {
		readiness string
		ents      []os.FileInfo
		claim     []string
		skip      map[string]partners.Skip
	}{
		{partners.ReadinessRename, []os.FileInfo{
			entry{"orders-2.csv", 0, at(2)},
			entry{"orders-1.csv", 0, at(1)},
			entry{".hidden.csv", 0, at(0)},
			entry{"orders-3.csv.part", 0, at(0)},
			entry{"orders-4.csv", fs.ModeSymlink, at(0)},
			entry{"orders-\x01.csv", 0, at(0)},
			entry{"invoice.pdf", 0, at(0)},
		}, []string{"orders-1.csv", "orders-2.csv"}, map[string]partners.Skip{
			".hidden.csv":       partners.SkipDotfile,
			"orders-3.csv.part": partners.SkipPartial,
			"orders-4.csv":      partners.SkipNotRegular,
			"orders-\x01.csv":   partners.SkipBadName,
			"invoice.pdf":       partners.SkipNoFeed,
		}},
		{partners.ReadinessManifest, []os.FileInfo{
			entry{"orders-1.csv", 0, at(1)},
			entry{"orders-1.csv" + partners.ManifestSuffix, 0, at(3)},
			entry{"orders-2.csv", 0, at(0)},
			entry{"orders-3.csv", 0, at(0)},
			entry{"orders-3.csv" + partners.ManifestSuffix, fs.ModeDir, at(0)},
		}, []string{"orders-1.csv"}, map[string]partners.Skip{
			"orders-1.csv" + partners.ManifestSuffix: partners.SkipManifest,
			"orders-2.csv":                           partners.SkipNoManifest,
			"orders-3.csv":                           partners.SkipNoManifest,
			"orders-3.csv" + partners.ManifestSuffix: partners.SkipNotRegular,
		}},
	} {
		p := &partners.Config{ID: "acme", Readiness: tc.readiness, Feeds: []partners.Feed{{Name: "orders", Pattern: `orders-.*\.csv`}}}
		p.SetDefaults()
		_ = p.Feeds[0].Validate("feeds[0]", tc.readiness) // compiles the pattern; the rest of the feed is not needed here
		cands, skipped := partners.ClassifyReady(p, tc.ents)
		var got []string
		for _, c := range cands {
			got = append(got, c.Name)
			if c.Feed == nil || c.Feed.Name != "orders" {
				t.Fatalf("%s: %s has feed %v", tc.readiness, c.Name, c.Feed)
			}
			if want := tc.readiness == partners.ReadinessManifest; want != (c.Manifest == c.Name+partners.ManifestSuffix) {
				t.Fatalf("%s: %s has manifest %q", tc.readiness, c.Name, c.Manifest)
			}
		}
		if len(got) != len(tc.claim) {
			t.Fatalf("%s: claimable %q, want %q", tc.readiness, got, tc.claim)
		}
		for i := range got {
			if got[i] != tc.claim[i] {
				t.Fatalf("%s: claimable %q, want %q", tc.readiness, got, tc.claim)
			}
		}
		if len(skipped) != len(tc.skip) {
			t.Fatalf("%s: %d skipped, want %d: %+v", tc.readiness, len(skipped), len(tc.skip), skipped)
		}
		for _, s := range skipped {
			if want := tc.skip[s.Info.Name()]; s.Reason != want {
				t.Fatalf("%s: %q skipped as %q, want %q", tc.readiness, s.Info.Name(), s.Reason, want)
			}
			if partners.Hostile(s.Reason) != (s.Reason == partners.SkipNotRegular || s.Reason == partners.SkipBadName || s.Reason == partners.SkipNoFeed) {
				t.Fatalf("%s: Hostile(%q) is wrong", tc.readiness, s.Reason)
			}
		}
	}
}
