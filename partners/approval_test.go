package partners_test

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/partner-intake/partner-intake/partners"
)

func TestApprovalPolicy(t *testing.T) {
	decode := func(s string) *partners.Approval {
		t.Helper()
		var a partners.Approval
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			t.Fatal(err)
		}
		return &a
	}
	f := func(a *partners.Approval) partners.Feed {
		return partners.Feed{Name: "orders", Pattern: `orders-.*\.csv`, Target: "orders", Key: []string{"id"},
			Columns: []partners.Column{{Name: "id", Type: partners.TypeText, Required: true}}, Approval: a}
	}
	for _, tc := range []struct {
		yaml, err string
	}{
		{"always: true", ""},
		{"max_delete_ratio: 0", ""},
		{"max_update_ratio: 0.2\nmax_rows: 1000", ""},
		{"max_delete_ratio: 1.5", "max_delete_ratio: 1.5 must be between 0 and 1"},
		{"max_update_ratio: -0.1", "max_update_ratio: -0.1 must be between 0 and 1"},
		{"max_rows: -1", "max_rows: -1 must not be negative"},
		{"always: false", "set always: true or at least one of"},
	} {
		feed := f(decode(tc.yaml))
		feed.SetDefaults()
		err := feed.Validate("feeds[0]", partners.ReadinessRename)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.err)
		}
	}
	// the policy is no part of the mapping: changing it re-plans nothing
	a, b := f(nil), f(decode("always: true"))
	if a.Hash() != b.Hash() {
		t.Error("the approval policy changes the feed's mapping hash")
	}
	for _, tc := range []struct {
		yaml                   string
		rows, updates, deletes int64
		wait                   bool
	}{
		{"always: true", 1, 0, 0, true},
		{"max_delete_ratio: 0", 10, 5, 0, false},
		{"max_delete_ratio: 0", 10, 0, 1, true},
		{"max_delete_ratio: 0.5", 4, 0, 2, false},
		{"max_delete_ratio: 0.5", 4, 0, 3, true},
		{"max_delete_ratio: 0.5", 0, 0, 1, true}, // an empty file that deletes
		{"max_update_ratio: 0.5", 4, 3, 0, true},
		{"max_rows: 3", 3, 3, 3, false},
		{"max_rows: 3", 4, 0, 0, true},
	} {
		if got, why := decode(tc.yaml).Needs(tc.rows, tc.updates, tc.deletes); got != tc.wait || got && why == "" {
			t.Errorf("%q rows %d updates %d deletes %d: wait %v (%q), want %v", tc.yaml, tc.rows, tc.updates, tc.deletes, got, why, tc.wait)
		}
	}
	var none *partners.Approval
	if got, _ := none.Needs(10, 10, 10); got {
		t.Error("no policy waits")
	}
}
