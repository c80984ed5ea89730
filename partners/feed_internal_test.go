package partners

import (
	"slices"
	"strings"
	"testing"
)

// Hash covers what decides a file's rows, nothing beside it: when files
// are due, how they are decrypted and to whom reports are sealed, and the
// approval policy leave it as it is; a column, the key, the target, the
// mode or the chunking change it. A hash recorded before Hash left expect
// and pgp out is still the same mapping.
func TestFeedHashIsTheMappingOnly(t *testing.T) {
	base := func() Feed {
		return Feed{Name: "orders", Pattern: `orders-.*\.csv`, Target: "orders", Key: []string{"id"},
			Columns: []Column{{Name: "id", Type: TypeText}, {Name: "amount", Type: TypeDecimal}}}
	}
	f0 := base()
	h := f0.Hash()
	same := map[string]func(*Feed){
		"expect": func(f *Feed) { f.Expect = &Expect{Schedule: "@daily"} },
		"pgp key paths": func(f *Feed) {
			f.PGP = &PGP{PrivateKeyFile: "/etc/intake/other.key", VerifyKeysFile: "/etc/intake/p.pub"}
		},
		"approval": func(f *Feed) { f.Approval = &Approval{Always: true} },
	}
	for what, change := range same {
		f := base()
		change(&f)
		if f.Hash() != h {
			t.Errorf("a change of %s changed the mapping's hash", what)
		}
		if full := hashJSON(&f); what != "approval" && (full == h || !f.SameMapping(full)) {
			t.Errorf("%s: a hash of every setting is not taken for the same mapping", what)
		}
	}
	other := map[string]func(*Feed){
		"column": func(f *Feed) { f.Columns[1].Type = TypeInteger },
		"key":    func(f *Feed) { f.Key = []string{"id", "amount"} },
		"target": func(f *Feed) { f.Target = "orders2" },
		"mode":   func(f *Feed) { f.Mode = ModeSnapshot },
		"chunks": func(f *Feed) { f.ChunkRows = 7 },
	}
	for what, change := range other {
		f := base()
		change(&f)
		if f.Hash() == h || f.SameMapping(h) {
			t.Errorf("a change of %s left the mapping's hash as it was", what)
		}
	}
}

// Every snapshot feed gets a delete guard, which only off: true removes;
// a guard is refused on a feed that deletes nothing and where its limits
// cannot be shares, and off with limits beside it is refused as unclear.
func TestDeleteGuardDefaultsAndValidation(t *testing.T) {
	feed := func(mode Mode, g *DeleteGuard) Feed {
		f := Feed{Name: "orders", Pattern: `orders-.*\.csv`, Target: "orders", Key: []string{"id"}, Mode: mode,
			Columns: []Column{{Name: "id", Type: TypeText}}, DeleteGuard: g}
		f.SetDefaults()
		return f
	}
	if f := feed(ModeSnapshot, nil); !f.Guarded() || f.DeleteGuard == nil {
		t.Fatal("a snapshot feed without a delete_guard block has no guard")
	}
	if f := feed(ModeSnapshot, &DeleteGuard{Off: true}); f.Guarded() {
		t.Fatal("delete_guard.off left the guard on")
	}
	if f := feed(ModeUpsert, nil); f.Guarded() || f.DeleteGuard != nil {
		t.Fatal("an upsert feed got a delete guard")
	}
	half := 0.5
	for _, c := range []struct {
		f    Feed
		want string
	}{
		{feed(ModeUpsert, &DeleteGuard{MinRows: 5}), "only a snapshot feed deletes"},
		{feed(ModeSnapshot, &DeleteGuard{MaxShare: func() *float64 { v := 1.5; return &v }()}), "must be between 0 and 1"},
		{feed(ModeSnapshot, &DeleteGuard{MinRows: -1}), "must not be negative"},
		{feed(ModeSnapshot, &DeleteGuard{Off: true, MaxShare: &half}), "off: true sets no limit"},
	} {
		if err := c.f.Validate("feed", ReadinessRename); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error saying %q", c.f.DeleteGuard, err, c.want)
		}
	}
	f := feed(ModeSnapshot, nil)
	if wait, _ := f.PlanWaits(19, 0, 1, 20); wait {
		t.Error("1 delete of 20 (5 %) waits under the default 10 %")
	}
	if wait, why := f.PlanWaits(2, 0, 18, 20); !wait || !strings.Contains(why, "18 deletes of the 20 rows") {
		t.Errorf("18 deletes of 20: wait %v (%q)", wait, why)
	}
	if wait, _ := f.PlanWaits(0, 0, 0, 0); wait {
		t.Error("a first snapshot into an empty table waits")
	}
}

// The feeds writing one table are named whatever way each names it: an
// unqualified target is the table in public.
func TestFeedsOnNamesEveryFeedOfOneTable(t *testing.T) {
	c := &Config{Feeds: []Feed{{Name: "orders", Target: "orders"}, {Name: "fix", Target: "public.orders"},
		{Name: "other", Target: "sales.orders"}, {Name: "items", Target: "items"}}}
	for target, want := range map[string][]string{
		"orders": {"orders", "fix"}, "public.orders": {"orders", "fix"}, "sales.orders": {"other"}, "items": {"items"},
	} {
		if got := c.FeedsOn(target); !slices.Equal(got, want) {
			t.Errorf("FeedsOn(%s) = %v, want %v", target, got, want)
		}
	}
}
