package target

import (
	"slices"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Every part of a feed that Load reads makes another cache entry;
// the feed's name and its partner do not (the partner id is a parameter).
func TestMappingKeyHoldsWhatTheTargetIsBuiltFrom(t *testing.T) {
	base := testenv.OrdersFeed()
	renamed := testenv.OrdersFeed()
	renamed.Name, renamed.Pattern = "other", "x"
	if mappingKey(&base) != mappingKey(&renamed) {
		t.Fatal("two feeds with one mapping got two keys")
	}
	reordered := testenv.OrdersFeed()
	slices.Reverse(reordered.Columns)
	retyped := testenv.OrdersFeed()
	retyped.Columns[5].Type = "decimal"
	rekeyed := testenv.OrdersFeed()
	rekeyed.Key = []string{"order_id", "status"}
	moved := testenv.OrdersFeed()
	moved.Target = "sales.orders"
	fewer := testenv.OrdersFeed()
	fewer.Columns = fewer.Columns[:5]
	seen := map[string]string{mappingKey(&base): "base"}
	for name, k := range map[string]string{
		"reordered": mappingKey(&reordered), "retyped": mappingKey(&retyped), "rekeyed": mappingKey(&rekeyed),
		"moved": mappingKey(&moved), "fewer": mappingKey(&fewer),
	} {
		if other, dup := seen[k]; dup {
			t.Fatalf("%s has the key of %s", name, other)
		}
		seen[k] = name
	}
}
