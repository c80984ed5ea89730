package partners

import "testing"

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
