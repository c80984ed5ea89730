package target

import (
	"bytes"
	"strings"
	"testing"
)

// appendNumericByStrings is appendNumeric as padded strings spell it: the
// integer part left-padded and the fraction right-padded with zeros to
// groups of four, each group read as one base-10000 digit.
func appendNumericByStrings(neg bool, intPart, frac string, dscale int) []uint16 {
	ip := strings.Repeat("0", (4-len(intPart)%4)%4) + intPart
	fp := frac + strings.Repeat("0", (4-len(frac)%4)%4)
	var digits []uint16
	for _, s := range []string{ip, fp} {
		for i := 0; i < len(s); i += 4 {
			g := s[i : i+4]
			digits = append(digits, uint16(g[0]-'0')*1000+uint16(g[1]-'0')*100+uint16(g[2]-'0')*10+uint16(g[3]-'0'))
		}
	}
	weight := len(ip)/4 - 1
	for len(digits) > 0 && digits[0] == 0 {
		digits, weight = digits[1:], weight-1
	}
	for len(digits) > 0 && digits[len(digits)-1] == 0 {
		digits = digits[:len(digits)-1]
	}
	sign := uint16(0)
	if neg && len(digits) > 0 {
		sign = 0x4000
	}
	if len(digits) == 0 {
		weight = 0
	}
	return append([]uint16{uint16(len(digits)), uint16(int16(weight)), sign, uint16(dscale)}, digits...)
}

// The numeric encoding's digit groups, made without padded strings, are
// those the padded strings spell, for any digits on either side of the
// point (more than 32 groups too).
func FuzzNumericGroups(f *testing.F) {
	for _, s := range []string{"0", "1", "-1", "0.5", "0.0001", "0.00001", "10000", "9999.9999", "12345.6789",
		"-99999.99", "100000000.01", "123456789012345678901234567890.123456789", "1000.001",
		strings.Repeat("9", 140) + "." + strings.Repeat("1", 7)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		neg, intPart, frac, err := splitDecimal(v)
		if err != nil || len(intPart)+len(frac) > 400 {
			return
		}
		got, err := appendNumeric(nil, neg, intPart, frac, len(frac))
		if err != nil {
			return
		}
		want := appendNumericByStrings(neg, intPart, frac, len(frac))
		var w []byte
		for _, d := range want {
			w = append(w, byte(d>>8), byte(d))
		}
		if !bytes.Equal(got, w) {
			t.Fatalf("%q: got % x, want % x", v, got, w)
		}
	})
}

// BenchmarkAppendNumeric times a decimal cell's numeric encoding.
func BenchmarkAppendNumeric(b *testing.B) {
	vals := []string{"123.45", "9.99", "10000.01", "0.5", "-42.10", "123456.78"}
	var dst []byte
	for i := 0; b.Loop(); i++ {
		neg, ip, fr, _ := splitDecimal(vals[i%len(vals)])
		dst, _ = appendNumeric(dst[:0], neg, ip, fr, 2)
	}
}
