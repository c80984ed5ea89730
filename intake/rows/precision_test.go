package rows

import (
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/partners"
)

// A declared precision bounds the digits of integer and decimal cells, so
// that `intake check` can prove a bounded target column holds them.
func TestPrecisionBoundsDigits(t *testing.T) {
	f := feed(t)
	f.Column("n").Precision = 4
	f.Column("amt").Precision = 5 // numeric(5,2): three digits before the point
	tests := []struct {
		n, amt, column string
		reason         reason.Code
	}{
		{"9999", "999.99", "", ""},
		{"-9999", "-999.99", "", ""},
		{"0009999", "000999.5", "", ""}, // leading zeros are no digits
		{"10000", "1", "n", reason.PrecisionExceeded},
		{"-10000", "1", "n", reason.PrecisionExceeded},
		{"1", "1000", "amt", reason.PrecisionExceeded},
		{"1", "-1000.5", "amt", reason.PrecisionExceeded},
		{"1", "0.99", "", ""},
	}
	for _, tt := range tests {
		rows, err := readAll(t, f, hdr+"k,"+tt.n+","+tt.amt+",01.02.2026,a,\n")
		if err != nil {
			t.Fatal(err)
		}
		if rows[0].column != tt.column || rows[0].issue != tt.reason {
			t.Fatalf("n=%s amt=%s: got %q/%q, want %q/%q", tt.n, tt.amt, rows[0].column, rows[0].issue, tt.column, tt.reason)
		}
	}
}

func TestPrecisionIsValidated(t *testing.T) {
	for _, c := range []partners.Column{
		{Name: "x", Type: partners.TypeInteger, Precision: 20},
		{Name: "x", Type: partners.TypeDecimal, Scale: 4, Precision: 3},
		{Name: "x", Type: partners.TypeText, MaxLength: 3, Precision: 3},
	} {
		f := &partners.Feed{Name: "f", Pattern: `x`, Target: "t", Key: []string{"k"},
			Columns: []partners.Column{{Name: "k", Type: partners.TypeText, Required: true}, c}}
		f.SetDefaults()
		if err := f.Validate("f", partners.ReadinessRename); err == nil {
			t.Fatalf("%+v: no error", c)
		}
	}
}
