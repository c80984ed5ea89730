package target

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/partners"
)

// Binary COPY: a chunk's values go to PostgreSQL in its binary wire format
// when every feed column lands in a target type encoded here, so the
// server skips parsing text (numeric_in, timestamptz_in: measured 13.5 ms
// of a 10k-row chunk's 45 ms merge). Anything else keeps COPY text.

// PostgreSQL type OIDs with a binary encoder here.
const (
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidVarchar     = 1043
	oidDate        = 1082
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
)

// Encoder appends one non-null value in binary (without its length).
type Encoder func(dst []byte, v string) ([]byte, error)

// binaryEncoder is the encoder for a feed column type landing in a target
// type (oid, with the column's typmod: -1 when it has none), or nil when
// that pair is left to COPY text. Where the target's type modifier would
// change a value on input (varchar(n) clips trailing spaces, numeric(p,s)
// rounds to s, timestamp(p) to p digits) the encoder applies it first, so
// what it writes is exactly the stored value's send form (see sendExact).
func binaryEncoder(feedType string, oid uint32, typmod int32) Encoder {
	switch feedType {
	case partners.TypeText, partners.TypeEmail, partners.TypeEnum:
		if oid == oidText || oid == oidVarchar && typmod < 4 {
			return encodeText
		}
		if oid == oidVarchar {
			return encodeVarchar(int(typmod - 4))
		}
	case partners.TypeInteger:
		switch oid {
		case oidInt2:
			return encodeInt(16)
		case oidInt4:
			return encodeInt(32)
		case oidInt8:
			return encodeInt(64)
		case oidNumeric:
			return numericEncoder(typmod)
		}
	case partners.TypeDecimal:
		if oid == oidNumeric {
			return numericEncoder(typmod)
		}
	case partners.TypeTimestamp:
		if oid == oidTimestamptz || oid == oidTimestamp {
			return timestampEncoder(typmod)
		}
	case partners.TypeDate:
		if oid == oidDate {
			return encodeDate
		}
	}
	return nil
}

// sendExact: what binaryEncoder writes for a value of this target type is
// byte for byte what the type's send function returns for the value as
// PostgreSQL stores it (send(recv(b)) == b), so intake can hash a row as
// it encodes it and the merge can recompute that hash from the stored
// values (rowHashSQL). Proven per type by TestGoRowHashEqualsSQLRowHash.
// numeric(p,s) with a negative scale (PostgreSQL 15) rounds before the
// point, which the encoder does not do: such a column keeps the staged
// path.
func sendExact(oid uint32, typmod int32) bool {
	switch oid {
	case oidInt2, oidInt4, oidInt8, oidText, oidVarchar, oidDate, oidTimestamp, oidTimestamptz:
		return true
	case oidNumeric:
		_, ok := numericScale(typmod)
		return ok || typmod < 4
	}
	return false
}

func encodeText(dst []byte, v string) ([]byte, error) { return append(dst, v...), nil }

// encodeVarchar writes a value for varchar(n) as varchar_input stores it:
// a value longer than n characters whose excess is all spaces is clipped
// to n characters (any other excess is left for PostgreSQL to refuse).
func encodeVarchar(n int) Encoder {
	return func(dst []byte, v string) ([]byte, error) {
		if len(v) > n { // bytes: at least as many as characters
			cut, chars := len(v), 0
			for i := range v {
				if chars == n {
					cut = i
					break
				}
				chars++
			}
			if strings.Trim(v[cut:], " ") == "" {
				v = v[:cut]
			}
		}
		return append(dst, v...), nil
	}
}

func encodeInt(bits int) Encoder {
	return func(dst []byte, v string) ([]byte, error) {
		n, err := strconv.ParseInt(v, 10, bits)
		if err != nil {
			return nil, fmt.Errorf("value out of range for a %d-bit integer column", bits)
		}
		switch bits {
		case 16:
			return binary.BigEndian.AppendUint16(dst, uint16(n)), nil
		case 32:
			return binary.BigEndian.AppendUint32(dst, uint32(n)), nil
		}
		return binary.BigEndian.AppendUint64(dst, uint64(n)), nil
	}
}

// numericScale is the scale s of a numeric(p,s) typmod, ok when the
// column has one that is not negative.
func numericScale(typmod int32) (int, bool) {
	if typmod < 4 {
		return 0, false
	}
	s := (int((typmod-4)&0x7ff) ^ 1024) - 1024 // PostgreSQL 15 allows -1000..1000
	return s, s >= 0
}

// numericEncoder is encodeNumeric for a column of that typmod: numeric(p,s)
// rounds to s digits after the point (half away from zero, as
// apply_typmod's round_var does) and stores display scale s.
func numericEncoder(typmod int32) Encoder {
	s, ok := numericScale(typmod)
	if !ok {
		return encodeNumeric
	}
	return func(dst []byte, v string) ([]byte, error) {
		neg, intPart, frac, err := splitDecimal(v)
		if err != nil {
			return nil, err
		}
		if len(frac) > s {
			up := frac[s] >= '5'
			frac = frac[:s]
			if up {
				d := []byte(intPart + frac)
				i := len(d) - 1
				for ; i >= 0 && d[i] == '9'; i-- {
					d[i] = '0'
				}
				if i < 0 {
					d = append([]byte{'1'}, d...)
				} else {
					d[i]++
				}
				intPart, frac = string(d[:len(d)-s]), string(d[len(d)-s:])
			}
		}
		return appendNumeric(dst, neg, intPart, frac, s)
	}
}

// encodeNumeric writes a canonical decimal ([-]digits[.digits], as the row
// checks normalise it) as PostgreSQL's numeric: base-10000 digits aligned
// on the decimal point, weight of the first, sign, display scale.
func encodeNumeric(dst []byte, v string) ([]byte, error) {
	neg, intPart, frac, err := splitDecimal(v)
	if err != nil {
		return nil, err
	}
	return appendNumeric(dst, neg, intPart, frac, len(frac))
}

func splitDecimal(v string) (neg bool, intPart, frac string, err error) {
	neg = strings.HasPrefix(v, "-")
	intPart, frac, _ = strings.Cut(strings.TrimPrefix(v, "-"), ".")
	if intPart == "" || !allDigits(intPart) || !allDigits(frac) {
		return false, "", "", fmt.Errorf("not a decimal number")
	}
	return neg, intPart, frac, nil
}

// appendNumeric writes the number as numeric_send writes the value
// numeric_recv and make_result store: no leading or trailing zero digit
// groups, zero without sign and of weight 0, display scale dscale (at
// least len(frac)).
func appendNumeric(dst []byte, neg bool, intPart, frac string, dscale int) ([]byte, error) {
	// groups of 4 decimal digits aligned on the point: the integer part
	// left-padded with zeros, the fraction right-padded (no allocation for
	// up to 32 groups: this runs for every decimal cell)
	lead := (4 - len(intPart)%4) % 4
	nInt, nFrac := (lead+len(intPart))/4, (len(frac)+3)/4
	var buf [32]uint16
	digits := buf[:0]
	if nInt+nFrac > len(buf) {
		digits = make([]uint16, 0, nInt+nFrac)
	}
	for g := range nInt {
		digits = append(digits, group(intPart, g*4-lead))
	}
	for g := range nFrac {
		digits = append(digits, group(frac, g*4))
	}
	weight := nInt - 1
	for len(digits) > 0 && digits[0] == 0 { // leading zero groups
		digits, weight = digits[1:], weight-1
	}
	for len(digits) > 0 && digits[len(digits)-1] == 0 { // trailing zero groups
		digits = digits[:len(digits)-1]
	}
	sign := uint16(0x0000)
	if neg && len(digits) > 0 {
		sign = 0x4000
	}
	if len(digits) == 0 {
		weight = 0
	}
	if len(digits) > math.MaxInt16 || weight > math.MaxInt16 || weight < math.MinInt16 {
		return nil, fmt.Errorf("decimal number too large")
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(digits)))
	dst = binary.BigEndian.AppendUint16(dst, uint16(int16(weight)))
	dst = binary.BigEndian.AppendUint16(dst, sign)
	dst = binary.BigEndian.AppendUint16(dst, uint16(dscale))
	for _, d := range digits {
		dst = binary.BigEndian.AppendUint16(dst, d)
	}
	return dst, nil
}

// group is the base-10000 digit of s[at:at+4], a position outside s
// counting as a zero digit.
func group(s string, at int) uint16 {
	var v uint16
	for i := at; i < at+4; i++ {
		v *= 10
		if i >= 0 && i < len(s) {
			v += uint16(s[i] - '0')
		}
	}
	return v
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// pgEpoch is PostgreSQL's timestamp and date origin.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// encodeTimestamp writes a canonical UTC timestamp (RFC 3339, as the row
// checks normalise it) as microseconds since 2000-01-01, rounded half to
// even like PostgreSQL's text input. For a timestamp without time zone
// that is the UTC wall clock, as the text cast keeps it.
func encodeTimestamp(dst []byte, v string) ([]byte, error) {
	us, err := timestampMicros(v)
	if err != nil {
		return nil, err
	}
	return binary.BigEndian.AppendUint64(dst, uint64(us)), nil
}

// timestampEncoder is encodeTimestamp for a column of that typmod:
// timestamp(p), p < 6, rounds to p digits after the second, half away
// from zero, as AdjustTimestampForTypmod does on input.
func timestampEncoder(typmod int32) Encoder {
	if typmod < 0 || typmod >= 6 {
		return encodeTimestamp
	}
	scale := int64(math.Pow10(6 - int(typmod)))
	return func(dst []byte, v string) ([]byte, error) {
		us, err := timestampMicros(v)
		if err != nil {
			return nil, err
		}
		if us >= 0 {
			us = (us + scale/2) / scale * scale
		} else {
			us = -((-us + scale/2) / scale * scale)
		}
		return binary.BigEndian.AppendUint64(dst, uint64(us)), nil
	}
}

// timestampMicros is the microseconds from PostgreSQL's epoch to v, an
// RFC 3339 timestamp, rounded as PostgreSQL reads it (half to even). The
// form the timestamp check writes is read without time.Parse
// (rows.UTCSeconds); any other goes through it.
func timestampMicros(v string) (int64, error) {
	secs, nsec, ok := rows.UTCSeconds(v)
	if !ok {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return 0, fmt.Errorf("not an RFC 3339 timestamp")
		}
		secs, nsec = t.Unix(), t.Nanosecond()
	}
	us, r := int64(nsec/1000), nsec%1000
	if r > 500 || (r == 500 && us%2 == 1) {
		us++ // as rows.Microseconds rounds
	}
	secs -= pgEpoch.Unix()
	if secs > math.MaxInt64/1_000_000-1 || secs < math.MinInt64/1_000_000+1 {
		return 0, fmt.Errorf("timestamp out of range")
	}
	return secs*1_000_000 + us, nil
}

// encodeDate writes a canonical date (2006-01-02) as days since 2000-01-01.
func encodeDate(dst []byte, v string) ([]byte, error) {
	t, err := time.Parse("2006-01-02", v)
	if err != nil {
		return nil, fmt.Errorf("not a date")
	}
	secs := t.Unix() - pgEpoch.Unix()
	days := secs / 86400
	if secs%86400 < 0 {
		days-- // floor, for dates before 2000
	}
	return binary.BigEndian.AppendUint32(dst, uint32(int32(days))), nil
}

// copyBinaryHeader opens a binary COPY stream; copyBinaryTrailer ends it.
var (
	copyBinaryHeader  = []byte("PGCOPY\n\xff\r\n\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	copyBinaryTrailer = []byte{0xff, 0xff}
)

// AppendCopyHeader appends what opens a binary COPY stream.
func AppendCopyHeader(dst []byte) []byte { return append(dst, copyBinaryHeader...) }

// AppendCopyTrailer appends what ends a binary COPY stream.
func AppendCopyTrailer(dst []byte) []byte { return append(dst, copyBinaryTrailer...) }
