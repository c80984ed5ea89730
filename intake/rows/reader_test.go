package rows

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/partners"
)

func feed(t *testing.T) *partners.Feed {
	t.Helper()
	f := &partners.Feed{
		Name: "f", Pattern: `x\.csv`, Target: "t",
		Columns: []partners.Column{
			{Name: "id", Type: partners.TypeText, Required: true, MaxLength: 5},
			{Name: "n", Type: partners.TypeInteger},
			{Name: "amt", Type: partners.TypeDecimal, Scale: 2},
			{Name: "d", Type: partners.TypeDate, Layout: "02.01.2006"},
			{Name: "kind", Type: partners.TypeEnum, Values: []string{"a", "b"}},
			{Name: "mail", Type: partners.TypeEmail},
		},
		Key: []string{"id"},
	}
	f.SetDefaults()
	if err := f.Validate("f", partners.ReadinessRename); err != nil {
		t.Fatal(err)
	}
	return f
}

const hdr = "id,n,amt,d,kind,mail\n"

type got struct {
	line   int64
	column string
	issue  reason.Code
	values []any
}

func readAll(t *testing.T, f *partners.Feed, src string) ([]got, error) {
	t.Helper()
	rd, err := NewReader(strings.NewReader(src), f, 0)
	if err != nil {
		return nil, err
	}
	var out []got
	for {
		row, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		g := got{line: row.Line}
		if row.Issue != nil {
			g.column, g.issue = row.Issue.Column, row.Issue.Reason
		} else {
			for i, v := range row.Values {
				if row.Null[i] {
					g.values = append(g.values, nil)
				} else {
					g.values = append(g.values, v)
				}
			}
		}
		out = append(out, g)
	}
}

func TestRowsGetAReasonCodePerProblem(t *testing.T) {
	tests := []struct {
		name, row, column string
		reason            reason.Code
	}{
		{"a valid row has no issue", "k1,42,3.10,01.02.2026,a,x@y.io", "", ""},
		{"a missing required key", ",1,1,01.02.2026,a,", "id", reason.RequiredMissing},
		{"text over max length", "abcdef,1,1,01.02.2026,a,", "id", reason.TooLong},
		{"an integer that is not one", "k,1.5,1,01.02.2026,a,", "n", reason.NotInteger},
		{"a decimal with letters", "k,1,1e3,01.02.2026,a,", "amt", reason.NotDecimal},
		{"a decimal over its scale", "k,1,1.001,01.02.2026,a,", "amt", reason.ScaleExceeded},
		{"a date in another layout is not guessed", "k,1,1,2026-02-01,a,", "d", reason.BadDate},
		{"a value outside the enum", "k,1,1,01.02.2026,c,", "kind", reason.NotInEnum},
		{"a malformed email", "k,1,1,01.02.2026,a,x@", "mail", reason.BadEmail},
		{"too few fields", "k,1,1", "", reason.FieldCount},
		{"too many fields", "k,1,1,01.02.2026,a,,extra", "", reason.FieldCount},
		{"a bare quote", `k"x,1,1,01.02.2026,a,`, "", reason.CSVSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := readAll(t, feed(t), hdr+tt.row+"\n")
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 {
				t.Fatalf("got %d rows, want 1", len(rows))
			}
			if rows[0].issue != tt.reason || rows[0].column != tt.column {
				t.Fatalf("got %q/%q, want %q/%q", rows[0].column, rows[0].issue, tt.column, tt.reason)
			}
			if rows[0].line != 2 {
				t.Fatalf("got line %d, want 2", rows[0].line)
			}
		})
	}
}

func TestValuesAreNormalised(t *testing.T) {
	rows, err := readAll(t, feed(t), "\uFEFF"+hdr+"k1, 042 ,-3.10,01.02.2026, b ,\r\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"k1", "42", "-3.1", "2026-02-01", "b", nil}
	for i, w := range want {
		if rows[0].values[i] != w {
			t.Fatalf("value %d: got %#v, want %#v", i, rows[0].values[i], w)
		}
	}
}

func TestLineNumbersFollowQuotedNewlines(t *testing.T) {
	src := hdr + "k1,1,1,,,\n\"k\n2\",1,1,,,\nk3,1,1,,,\n"
	rows, err := readAll(t, feed(t), src)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].line != 2 || rows[1].line != 3 || rows[2].line != 5 {
		t.Fatalf("got %+v, want lines 2, 3, 5", rows)
	}
	if rows[1].issue != "" || rows[1].values[0] != "k\n2" {
		t.Fatalf("quoted newline row: %+v", rows[1])
	}
}

func TestWholeFileProblemsAreTerminal(t *testing.T) {
	long := strings.Repeat("x", MaxLineBytes+10)
	tests := []struct {
		name, src string
		reason    reason.Code
		line      int64
	}{
		{"a renamed header column", "id,n,amount,d,kind,mail\nk,1,1,,,\n", reason.HeaderMismatch, 1},
		{"a repeated header column", "id,n,n,d,kind,mail\n", reason.HeaderMismatch, 1},
		{"an extra header column", hdr[:len(hdr)-1] + ",x\n", reason.HeaderMismatch, 1},
		{"an empty file", "", reason.EmptyFile, 0},
		{"binary content under a csv name", hdr + "k,1,\x00\x01,,,\n", reason.BinaryContent, 2},
		{"invalid UTF-8", hdr + "k\xff,1,1,,,\n", reason.InvalidEncoding, 2},
		{"a line longer than the limit is never buffered whole", hdr + long + "\n", reason.LineTooLong, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readAll(t, feed(t), tt.src)
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FileError", err)
			}
			if fe.Reason != tt.reason || fe.Line != tt.line {
				t.Fatalf("got %s at line %d, want %s at line %d", fe.Reason, fe.Line, tt.reason, tt.line)
			}
			if strings.Contains(fe.Error(), "k\xff") {
				t.Fatal("the error echoes a cell value")
			}
		})
	}
}

// failingReader yields its bytes, then err: a disk that fails mid-file.
type failingReader struct {
	data string
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.data == "" {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// A file's bytes that cannot be read (the spool's disk failing, in the
// header or after rows) are not the partner's fault: the error is not a
// FileError, so the file is retried rather than failed for good, and it
// keeps its cause. A header the CSV reader cannot parse is the file's.
func TestAReadErrorBelowTheRowsIsNotTheFiles(t *testing.T) {
	eio := errors.New("read /spool/acme/sha256/ab/abcd: input/output error")
	for _, tt := range []struct{ name, data string }{
		{"in the header", ""},
		{"after rows", hdr + "k,1,1,,,\nl,2,2,,,\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			rd, err := NewReader(&failingReader{data: tt.data, err: eio}, feed(t), 0)
			if err == nil {
				for err == nil {
					_, err = rd.Next()
				}
			}
			var fe *FileError
			if errors.As(err, &fe) {
				t.Fatalf("got the file's failure %s (%q), want a read error", fe.Reason, fe.Detail)
			}
			if !errors.Is(err, eio) {
				t.Fatalf("got %v, want the read error", err)
			}
		})
	}
	_, err := NewReader(strings.NewReader("id,\"n\"x,amt,d,kind,mail\n"), feed(t), 0)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Reason != reason.Unreadable || fe.Line != 1 {
		t.Fatalf("a header the CSV reader cannot parse: got %v, want unreadable at line 1", err)
	}
}

func TestMaxRowsFailsTheFile(t *testing.T) {
	rd, err := NewReader(strings.NewReader(hdr+"a,,,,,\nb,,,,,\nc,,,,,\n"), feed(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	var fe *FileError
	for {
		_, err := rd.Next()
		if errors.As(err, &fe) {
			break
		}
		if err != nil {
			t.Fatalf("got %v, want too_many_rows", err)
		}
	}
	if fe.Reason != reason.TooManyRows || fe.Line != 4 {
		t.Fatalf("got %s at %d", fe.Reason, fe.Line)
	}
}

func TestDeclaredSingleByteEncodingsAreDecoded(t *testing.T) {
	tests := []struct {
		name, encoding, cell, want string
		reason                     reason.Code
	}{
		{"latin-1 e-acute", partners.EncodingISO88591, "Caf\xe9", "Café", ""},
		{"windows-1252 euro sign", partners.EncodingWindows1252, "\x80 10", "€ 10", ""},
		{"windows-1252 undefined byte is invalid", partners.EncodingWindows1252, "x\x81", "", reason.InvalidEncoding},
		{"the same latin-1 bytes read as utf-8 are invalid", partners.EncodingUTF8, "Caf\xe9", "", reason.InvalidEncoding},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := feed(t)
			f.CSV.Encoding = tt.encoding
			f.Columns[0].MaxLength = 50
			rows, err := readAll(t, f, hdr+tt.cell+",1,1,,,\n")
			if tt.reason != "" {
				var fe *FileError
				if !errors.As(err, &fe) || fe.Reason != tt.reason || fe.Line != 2 {
					t.Fatalf("got %v, want %s at line 2", err, tt.reason)
				}
				return
			}
			if err != nil || len(rows) != 1 || rows[0].values[0] != tt.want {
				t.Fatalf("got %+v %v, want %q", rows, err, tt.want)
			}
		})
	}
}

// endlessLine yields a header and then one line of n bytes without a
// newline, generated lazily: the input is never held in memory.
type endlessLine struct {
	head []byte
	left int64
}

func (e *endlessLine) Read(p []byte) (int, error) {
	if len(e.head) > 0 {
		n := copy(p, e.head)
		e.head = e.head[n:]
		return n, nil
	}
	if e.left <= 0 {
		return 0, io.EOF
	}
	n := len(p)
	if int64(n) > e.left {
		n = int(e.left)
	}
	for i := range p[:n] {
		p[i] = 'x'
	}
	e.left -= int64(n)
	return n, nil
}

// A 1 GB line is refused after MaxLineBytes without being buffered whole:
// the reader's memory stays small while it streams.
func TestAOneGigabyteLineIsNeverBuffered(t *testing.T) {
	src := &endlessLine{head: []byte(hdr), left: 1 << 30}
	var before, after runtime.MemStats
	f := feed(t)
	runtime.GC()
	runtime.ReadMemStats(&before)
	rd, err := NewReader(src, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rd.Next()
	runtime.ReadMemStats(&after)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Reason != reason.LineTooLong || fe.Line != 2 {
		t.Fatalf("got %v, want line_too_long at line 2", err)
	}
	if consumed := (1 << 30) - src.left; consumed > 2*MaxLineBytes {
		t.Fatalf("read %d bytes before refusing the line", consumed)
	}
	if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > 64<<20 {
		t.Fatalf("allocated %d MiB while refusing the line", grew>>20)
	}
}

func TestMaxLineBytesIsConfigurable(t *testing.T) {
	f := feed(t)
	f.CSV.MaxLineBytes = 100
	_, err := readAll(t, f, hdr+"k,1,1,,,"+strings.Repeat("x", 200)+"\n")
	var fe *FileError
	if !errors.As(err, &fe) || fe.Reason != reason.LineTooLong || fe.Line != 2 {
		t.Fatalf("got %v, want line_too_long at line 2", err)
	}
}

// quotedLines yields a header, a few good rows, then a record whose last
// field is one quoted field of short lines that never closes before n
// bytes: generated lazily, never held in memory.
type quotedLines struct {
	head []byte
	left int64
	line []byte
}

func (q *quotedLines) Read(p []byte) (int, error) {
	if len(q.head) > 0 {
		n := copy(p, q.head)
		q.head = q.head[n:]
		return n, nil
	}
	if q.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && q.left > 0 {
		m := copy(p[n:], q.line)
		n += m
		q.left -= int64(m)
	}
	return n, nil
}

// A 1 GiB quoted field made of 1 KiB lines (no line over the line bound)
// fails the file with record_too_large at the line the record starts on,
// after reading about max_record_bytes, never buffering the record.
func TestAQuotedFieldOfShortLinesIsBoundedWhileReading(t *testing.T) {
	f := feed(t)
	f.CSV.MaxRecordBytes = 1 << 20
	src := &quotedLines{head: []byte(hdr + "a,1,1,,,\nb,2,2,,,\n\"c\",3,3,,,\"x\n"), left: 1 << 30,
		line: []byte(strings.Repeat("y", 1023) + "\n")}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rd, err := NewReader(src, f, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		row, err := rd.Next()
		if err != nil || row.Issue != nil {
			t.Fatalf("row %d: %v %+v", i, err, row)
		}
	}
	_, err = rd.Next()
	runtime.ReadMemStats(&after)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge || fe.Line != 4 {
		t.Fatalf("got %v, want record_too_large at line 4", err)
	}
	if consumed := (1 << 30) - src.left; consumed > 2<<20 {
		t.Fatalf("read %d bytes before refusing the record", consumed)
	}
	if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > 16<<20 {
		t.Fatalf("allocated %d MiB while refusing the record", grew>>20)
	}
	if _, err := rd.Next(); !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge {
		t.Fatalf("after the refusal: %v", err)
	}
}

// The bound is exact on records that end: one byte over fails the file,
// a record of exactly the bound is read.
func TestMaxRecordBytesIsExact(t *testing.T) {
	f := feed(t)
	rec := func(n int) string { // a record of n bytes, newline included
		pre := "k,1,1,,,\""
		return pre + strings.Repeat("z", n-len(pre)-2) + "\"\n"
	}
	f.CSV.MaxRecordBytes = 200
	rows, err := readAll(t, f, hdr+rec(200)+"m,2,2,,,\n")
	if err != nil || len(rows) != 2 {
		t.Fatalf("a record of exactly the bound: %v %v", rows, err)
	}
	_, err = readAll(t, f, hdr+"m,2,2,,,\n"+rec(201))
	var fe *FileError
	if !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge || fe.Line != 3 {
		t.Fatalf("got %v, want record_too_large at line 3", err)
	}
	_, err = readAll(t, f, hdr+"m,2,2,,,\n"+rec(20000))
	if !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge || fe.Line != 3 {
		t.Fatalf("got %v, want record_too_large at line 3", err)
	}
}

// The default record bound leaves room for every declared column at
// max_field_bytes with its quotes doubled, is at least a line and at most
// 16 MiB unless the line bound is larger.
func TestTheDefaultRecordBoundFollowsTheFeed(t *testing.T) {
	f := feed(t) // 6 columns of 64 KiB: under the 4 MiB line bound
	if got := RecordBytes(f); got != MaxLineBytes {
		t.Fatalf("got %d, want the line bound %d", got, MaxLineBytes)
	}
	f.CSV.MaxFieldBytes = 2 << 20 // 6 columns of 2 MiB, quotes doubled
	if got := RecordBytes(f); got != MaxRecordBytes {
		t.Fatalf("got %d, want the cap %d", got, MaxRecordBytes)
	}
	f.CSV.MaxFieldBytes = 512 << 10
	if got, want := RecordBytes(f), 6*(2*(512<<10)+4); got != want {
		t.Fatalf("got %d, want %d", got, want)
	}
	f.CSV.MaxLineBytes = 32 << 20
	if got := RecordBytes(f); got != 32<<20 {
		t.Fatalf("got %d, want the larger line bound", got)
	}
	f.CSV.MaxRecordBytes = 5000
	if got := RecordBytes(f); got != 5000 {
		t.Fatalf("got %d, want the configured 5000", got)
	}
}

// A leading byte order mark goes before the CSV reader sees the first
// field, so a quoted first header name (PowerShell's Export-Csv -Encoding
// UTF8 writes both) reads as itself, and so does a quoted first value of
// a feed without a header; a mark anywhere else is the cell's.
func TestABOMBeforeAQuotedFirstFieldIsNotABareQuote(t *testing.T) {
	quoted := `"id","n","amt","d","kind","mail"` + "\n"
	rows, err := readAll(t, feed(t), "\uFEFF"+quoted+`"k1","1","2.50","01.02.2026","a",""`+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].issue != "" || rows[0].values[0] != "k1" {
		t.Fatalf("got %+v", rows)
	}
	f := feed(t)
	no := false
	f.CSV.Header = &no
	rows, err = readAll(t, f, "\uFEFF"+`"k2",1,1,,,`+"\n"+"\uFEFFk3,1,1,,,\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].issue != "" || rows[0].values[0] != "k2" || rows[1].values[0] != "\uFEFFk3" {
		t.Fatalf("got %+v: want k2 read, and the mark that begins the second row kept", rows)
	}
}

// A record of more fields than MaxFields fails the file before the CSV
// reader splits it (it keeps about 40 bytes a field: a line of empty
// fields within the line bound would hold some 160 MiB); commas inside
// quotes are no fields, and a few stray fields are one row's problem.
func TestARecordOfTooManyFieldsFailsBeforeItIsSplit(t *testing.T) {
	f := feed(t)
	max := MaxFields(f)
	quotedCommas := `"` + strings.Repeat(",", 10*max) + `"`
	rows, err := readAll(t, f, hdr+quotedCommas+",1,1,,,\nk2,1,1,,,"+strings.Repeat(",", max-10)+"\nk3,1,1,,,\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].issue != reason.TooLong || rows[1].issue != reason.FieldCount || rows[2].issue != "" {
		t.Fatalf("got %+v: want a long quoted id, a row of stray fields, a good row", rows)
	}
	// a bare quote spoils its own row only: the quoting is followed as
	// the CSV reader follows it, so quoted commas after it are no fields,
	// and a line of empty fields after it is still counted
	var quotedRows strings.Builder
	for i := range max {
		fmt.Fprintf(&quotedRows, "q%d,1,1,,\"a, b, c\",\n", i)
	}
	rows, err = readAll(t, f, hdr+"k1,24\" monitor,5,,,\n"+quotedRows.String())
	if err != nil {
		t.Fatalf("quoted commas after a bare quote: %v", err)
	}
	if len(rows) != max+1 || rows[0].issue != reason.CSVSyntax {
		t.Fatalf("%d rows, the first %+v: want the bare quote's row refused and the %d after it read", len(rows), rows[0], max)
	}
	_, err = readAll(t, f, hdr+"k1,24\" monitor,5,,,\nk2"+strings.Repeat(",", 10*max)+"\n")
	if fe := (*FileError)(nil); !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge || fe.Line != 3 {
		t.Fatalf("a line of empty fields after a bare quote: %v, want record_too_large at line 3", err)
	}
	for _, sep := range []string{",", "§"} {
		g := feed(t)
		g.CSV.Delimiter = sep
		h := strings.ReplaceAll(hdr, ",", sep)
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := readAll(t, g, h+"k1"+strings.Repeat(sep, MaxLineBytes/len(sep)-10)+"\n")
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		var fe *FileError
		if !errors.As(err, &fe) || fe.Reason != reason.RecordTooLarge || fe.Line != 2 || !strings.Contains(fe.Detail, "fields") {
			t.Fatalf("delimiter %q: got %v, want record_too_large at line 2 for its fields", sep, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
			t.Fatalf("delimiter %q: %d MiB allocated for a record refused for its fields", sep, grew>>20)
		}
	}
}
