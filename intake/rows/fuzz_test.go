package rows

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// FuzzReader feeds arbitrary bytes through the CSV reader and validator.
// Whatever the input: no panic, a terminal error is a *FileError with a
// known reason, every row has a positive, non-decreasing line number, every
// issue carries a known reason, accepted values are valid UTF-8, and no
// error text echoes the input.
func FuzzReader(f *testing.F) {
	for _, seed := range []string{
		hdr + "k1,42,3.10,01.02.2026,a,x@y.io\n",
		"\uFEFF" + hdr + "k,1,1,,,\r\n",
		hdr + "\"k\n2\",1,1,,,\n",
		hdr + `k"x,1,1,,,` + "\n",
		hdr + "k,1,1\n",
		"id,n\n",
		hdr + "k\x00,1,1,,,\n",
		hdr + "k\xff,1,1,,,\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	known := map[reason.Code]bool{}
	for _, r := range []reason.Code{reason.RequiredMissing, reason.TooLong, reason.NotInteger, reason.NotDecimal, reason.ScaleExceeded,
		reason.BadDate, reason.BadTimestamp, reason.NotInEnum, reason.BadEmail, reason.FieldCount, reason.CSVSyntax, reason.FieldTooLong,
		reason.HeaderMismatch, reason.InvalidEncoding, reason.BinaryContent, reason.LineTooLong, reason.RecordTooLarge, reason.EmptyFile, reason.TooManyRows,
		reason.Unreadable, reason.PrecisionExceeded} {
		known[r] = true
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fd := feed(t)
		rd, err := NewReader(bytes.NewReader(data), fd, 1000)
		check := func(err error) {
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("got %T %v, want a *FileError", err, err)
			}
			if !known[fe.Reason] {
				t.Fatalf("unknown reason %q", fe.Reason)
			}
			if len(data) > 8 && fe.Reason != reason.Unreadable && strings.Contains(fe.Error(), string(data)) {
				t.Fatalf("error echoes the input: %v", fe)
			}
		}
		if err != nil {
			check(err)
			return
		}
		var last int64
		for {
			row, err := rd.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				check(err)
				return
			}
			if row.Line < 1 || row.Line < last {
				t.Fatalf("line %d after %d", row.Line, last)
			}
			last = row.Line
			if row.Issue != nil {
				if !known[row.Issue.Reason] {
					t.Fatalf("unknown row reason %q", row.Issue.Reason)
				}
				continue
			}
			for i, v := range row.Values {
				if !utf8.ValidString(v) {
					t.Fatalf("column %d accepted invalid UTF-8", i)
				}
			}
		}
	})
}
