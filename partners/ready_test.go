package partners_test

import (
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

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
		skip      map[string]reason.Code
	}{
		{partners.ReadinessRename, []os.FileInfo{
			entry{"orders-2.csv", 0, at(2)},
			entry{"orders-1.csv", 0, at(1)},
			entry{".hidden.csv", 0, at(0)},
			entry{"orders-3.csv.part", 0, at(0)},
			entry{"orders-4.csv", fs.ModeSymlink, at(0)},
			entry{"orders-\x01.csv", 0, at(0)},
			entry{"orders-\u202evsc.csv", 0, at(0)},
			entry{"orders-\u200b1.csv", 0, at(0)},
			entry{"invoice.pdf", 0, at(0)},
		}, []string{"orders-1.csv", "orders-2.csv"}, map[string]reason.Code{
			".hidden.csv":          reason.Dotfile,
			"orders-3.csv.part":    reason.PartialUpload,
			"orders-4.csv":         reason.NotRegularFile,
			"orders-\x01.csv":      reason.BadName,
			"orders-\u202evsc.csv": reason.DeceptiveName,
			"orders-\u200b1.csv":   reason.DeceptiveName,
			"invoice.pdf":          reason.NoFeed,
		}},
		{partners.ReadinessManifest, []os.FileInfo{
			entry{"orders-1.csv", 0, at(1)},
			entry{"orders-1.csv" + partners.ManifestSuffix, 0, at(3)},
			entry{"orders-2.csv", 0, at(0)},
			entry{"orders-3.csv", 0, at(0)},
			entry{"orders-3.csv" + partners.ManifestSuffix, fs.ModeDir, at(0)},
		}, []string{"orders-1.csv"}, map[string]reason.Code{
			"orders-1.csv" + partners.ManifestSuffix: reason.ManifestFile,
			"orders-2.csv":                           reason.ManifestMissing,
			"orders-3.csv":                           reason.ManifestMissing,
			"orders-3.csv" + partners.ManifestSuffix: reason.NotRegularFile,
		}},
		{partners.ReadinessStable, []os.FileInfo{
			entry{"orders-1.csv", 0, at(1)},
			entry{"orders-2.csv.tmp", 0, at(0)},
			entry{"~orders-3.csv", 0, at(0)},
			entry{"orders-4.csv.filepart", 0, at(0)},
			entry{"orders-5.csv.part", 0, at(0)},
		}, []string{"orders-1.csv"}, map[string]reason.Code{
			"orders-2.csv.tmp":      reason.IgnoredName,
			"~orders-3.csv":         reason.IgnoredName,
			"orders-4.csv.filepart": reason.IgnoredName,
			"orders-5.csv.part":     reason.PartialUpload,
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
			if partners.Hostile(s.Reason) != (s.Reason == reason.NotRegularFile || s.Reason == reason.BadName || s.Reason == reason.DeceptiveName || s.Reason == reason.NoFeed) {
				t.Fatalf("%s: Hostile(%q) is wrong", tc.readiness, s.Reason)
			}
		}
	}
}

// Readiness stable: a candidate is ready only once listings have seen it
// unchanged for stable_for (never at first sight) and its mtime is
// min_age old.
func TestClassifyStableNeedsTimeUnchangedAndAge(t *testing.T) {
	p := &partners.Config{ID: "acme", Readiness: partners.ReadinessStable,
		Stable: partners.Stable{StableFor: time.Minute, MinAge: 10 * time.Minute}}
	p.SetDefaults()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := partners.Candidate{Name: "orders-1.csv", MTime: now.Add(-time.Hour)}
	young := partners.Candidate{Name: "orders-2.csv", MTime: now.Add(-5 * time.Minute)}
	for _, tc := range []struct {
		what string
		c    partners.Candidate
		u    partners.Unchanged
		want reason.Code
	}{
		{"first sight", old, partners.Unchanged{Since: now, Now: now}, reason.NotStable},
		{"unchanged for less than stable_for", old, partners.Unchanged{Since: now.Add(-59 * time.Second), Now: now}, reason.NotStable},
		{"unchanged for stable_for", old, partners.Unchanged{Since: now.Add(-time.Minute), Now: now}, ""},
		{"stable but younger than min_age", young, partners.Unchanged{Since: now.Add(-time.Hour), Now: now}, reason.NotStable},
		{"never recorded", old, partners.Unchanged{}, reason.NotStable},
	} {
		if got := partners.ClassifyStable(p, tc.c, tc.u); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.what, got, tc.want)
		}
	}
	if len(p.Stable.Ignore) == 0 {
		t.Fatal("no default ignore patterns")
	}
}

// The stable block is validated: a bad pattern or a zero stable_for is
// named, and the block is refused under another readiness.
func TestStableConfigIsValidated(t *testing.T) {
	base := func() partners.Config {
		return partners.Config{ID: "acme", Readiness: partners.ReadinessStable,
			SFTP:  partners.SFTP{Address: "h:22", User: "u", PasswordEnv: "P", KnownHostsFile: "k"},
			Feeds: []partners.Feed{{Name: "orders", Pattern: `orders-.*\.csv`, Target: "orders", Key: []string{"id"}, Columns: []partners.Column{{Name: "id", Type: partners.TypeText, Required: true}}}}}
	}
	c := base()
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Stable.StableFor != partners.DefaultStableFor || c.Stable.MinAge != partners.DefaultMinAge {
		t.Fatalf("defaults %+v", c.Stable)
	}
	c = base()
	c.Stable.Ignore = []string{"[x"}
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err == nil || !strings.Contains(err.Error(), "stable.ignore[0]") {
		t.Fatalf("bad pattern: %v", err)
	}
	c = base()
	c.Readiness = partners.ReadinessRename
	c.Stable.StableFor = time.Minute
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err == nil || !strings.Contains(err.Error(), "stable") {
		t.Fatalf("stable block under rename: %v", err)
	}
	c = base()
	c.Claim = partners.ClaimRecord
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err != nil || !c.Records() {
		t.Fatalf("claim: record under readiness stable: %v", err)
	}
	c = base()
	c.Readiness, c.Claim = partners.ReadinessRename, partners.ClaimRecord
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err == nil || !strings.Contains(err.Error(), "claim: record needs readiness: stable") {
		t.Fatalf("claim: record under rename: %v", err)
	}
	c = base()
	c.Claim = "copy"
	c.SetDefaults()
	if err := c.Validate("partners[0]"); err == nil || !strings.Contains(err.Error(), ".claim") {
		t.Fatalf("a bad claim mode: %v", err)
	}
}

func TestManifestsPastTheirCapAskTheSite(t *testing.T) {
	var asked []string
	site := func(name string) bool { asked = append(asked, name); return name == "late.csv.complete" }
	var m partners.Manifests
	m.Add("a.csv.complete")
	if !m.Has("a.csv.complete", site) || m.Has("b.csv.complete", site) || len(asked) != 0 {
		t.Fatalf("under the cap: the site asked %q", asked)
	}
	for i := range partners.MaxManifestNames {
		m.Add(fmt.Sprintf("f%d.csv.complete", i))
	}
	if !m.Has("late.csv.complete", site) || m.Has("gone.csv.complete", site) {
		t.Fatal("past the cap: a manifest not remembered is not looked up on the site")
	}
	if !m.Has("a.csv.complete", site) || len(asked) != 2 {
		t.Fatalf("past the cap: a remembered manifest asked the site too (%q)", asked)
	}
}
