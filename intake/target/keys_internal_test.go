package target

import (
	"testing"

	"github.com/partner-intake/partner-intake/partners"
)

// keyExact: a key column compares as intake's normalised text only where
// equal values have one text (the row check's normal forms) and the
// target's equality is byte equality of it.
func TestKeyExactOnlyWhereEqualKeysHaveOneText(t *testing.T) {
	text := partners.Column{Type: partners.TypeText}
	integer := partners.Column{Type: partners.TypeInteger}
	dec2 := partners.Column{Type: partners.TypeDecimal, Scale: 2}
	dec3 := partners.Column{Type: partners.TypeDecimal, Scale: 3}
	numeric12_2 := int32((12<<16 | 2) + 4)
	for _, c := range []struct {
		name string
		feed partners.Column
		col  catalogColumn
		want bool
	}{
		{"text", text, catalogColumn{baseName: "text", deterministic: true}, true},
		{"varchar, collation C", text, catalogColumn{baseName: "varchar", deterministic: true, collation: `pg_catalog."C"`}, true},
		{"text, nondeterministic collation", text, catalogColumn{baseName: "text", collation: "public.ci"}, false},
		{"citext", text, catalogColumn{baseName: "citext", deterministic: true}, false},
		{"char(n): trailing blanks do not count", text, catalogColumn{baseName: "bpchar", deterministic: true}, false},
		{"uuid: capitals, braces", text, catalogColumn{baseName: "uuid"}, false},
		{"integer fed as integer", integer, catalogColumn{baseName: "int4"}, true},
		{"integer fed as text: ' 1' is 1", text, catalogColumn{baseName: "int8"}, false},
		{"numeric(12,2) fed scale 2", dec2, catalogColumn{baseName: "numeric", typmod: numeric12_2}, true},
		{"numeric(12,2) fed scale 3: rounds two values into one", dec3, catalogColumn{baseName: "numeric", typmod: numeric12_2}, false},
		{"numeric", dec3, catalogColumn{baseName: "numeric", typmod: -1}, true},
		{"varchar(8) fed up to 8", partners.Column{Type: partners.TypeText, MaxLength: 8}, catalogColumn{baseName: "varchar", deterministic: true, typmod: 8 + 4}, true},
		{"varchar(3) fed up to 8: 'abc' and 'abc  ' are one", partners.Column{Type: partners.TypeText, MaxLength: 8}, catalogColumn{baseName: "varchar", deterministic: true, typmod: 3 + 4}, false},
		{"timestamptz", partners.Column{Type: partners.TypeTimestamp}, catalogColumn{baseName: "timestamptz", typmod: -1}, true},
		{"timestamptz(6)", partners.Column{Type: partners.TypeTimestamp}, catalogColumn{baseName: "timestamptz", typmod: 6}, true},
		{"timestamptz(0): .3 and .4 are one", partners.Column{Type: partners.TypeTimestamp}, catalogColumn{baseName: "timestamptz", typmod: 0}, false},
		{"timestamp(0) fed as date", partners.Column{Type: partners.TypeDate}, catalogColumn{baseName: "timestamp", typmod: 0}, true},
		{"date fed as timestamp: one day, many instants", partners.Column{Type: partners.TypeTimestamp}, catalogColumn{baseName: "date"}, false},
		{"enum", partners.Column{Type: partners.TypeEnum}, catalogColumn{baseName: "status", enum: true}, true},
		{"a domain over text", text, catalogColumn{baseName: "text", deterministic: true, domain: "order_code"}, false},
	} {
		if got := keyExact(c.feed, &c.col); got != c.want {
			t.Errorf("%s: keyExact = %v, want %v", c.name, got, c.want)
		}
	}
}
