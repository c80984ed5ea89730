package rows

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/reason"

	"golang.org/x/text/encoding/charmap"

	"github.com/partner-intake/partner-intake/partners"
)

// MaxLineBytes is the default bound of one physical line (csv.max_line_bytes);
// a longer one fails the file
// instead of being buffered whole.
const MaxLineBytes = 4 << 20

// MaxRecordBytes caps the default bound of one record (see
// RecordBytes) unless the line bound is larger.
const MaxRecordBytes = 16 << 20

// RecordBytes is the bound of one record of the feed (csv.max_record_bytes):
// every physical line of it, quoted fields spanning lines included.
// encoding/csv keeps a whole record in memory (and a copy as strings), so
// this, not the line bound, is what bounds the reader's memory. By
// default: room for every declared column at max_field_bytes with its
// quotes doubled (a longer record holds a field over max_field_bytes or
// more fields than declared, so its row would be rejected anyway), at
// least one line (max_line_bytes), at most MaxRecordBytes unless the line
// bound is larger.
func RecordBytes(feed *partners.Feed) int {
	if feed.CSV.MaxRecordBytes > 0 {
		return feed.CSV.MaxRecordBytes
	}
	maxLine := feed.CSV.MaxLineBytes
	if maxLine <= 0 {
		maxLine = MaxLineBytes
	}
	n := min(len(feed.Columns)*(2*feed.CSV.MaxFieldBytes+4), MaxRecordBytes) // + quotes, delimiter or CRLF
	return max(n, maxLine)
}

// recordSlack is how far past the end of the last record the CSV reader's
// buffer may have read ahead (bufio's default size) without the record it
// is reading being over the bound yet.
const recordSlack = 4096

// sourceBuffer is how much of the file one read of its source asks for:
// the CSV reader reads 4 KiB at a time, a system call each on a spooled
// file (0.25 s of intake's 8 s of CPU for a 300 MB file).
const sourceBuffer = 64 << 10

// Row is one data row of the file.
type Row struct {
	// Line is the 1-based line the record starts on.
	Line int64
	// Index is the 0-based position among data rows; chunks are ranges of it.
	Index int64
	// Values are the normalised column values, valid until the next call
	// to Next; Null[i] marks an empty optional cell (Values[i] is then "").
	Values []string
	Null   []bool
	// Issue is set when the row is rejected; Values is then undefined.
	Issue *Issue
}

// Reader yields validated rows.
type Reader struct {
	feed    *partners.Feed
	csv     *csv.Reader
	guard   *guard
	rec     *recordLimit
	checks  []check
	row     Row
	next    int64
	maxRows int64
	decoded bool // a single-byte encoding was decoded to UTF-8
}

// NewReader reads the header (when the dialect has one) and checks it.
func NewReader(r io.Reader, feed *partners.Feed, maxRows int64) (*Reader, error) {
	maxLine := feed.CSV.MaxLineBytes
	if maxLine <= 0 {
		maxLine = MaxLineBytes
	}
	switch r.(type) {
	case *bytes.Reader, *strings.Reader, *bufio.Reader: // in memory already
	default:
		r = bufio.NewReaderSize(r, sourceBuffer)
	}
	g := &guard{r: r, max: maxLine, line: 1}
	var src io.Reader = g
	if feed.CSV.Encoding == partners.EncodingUTF8 {
		// a leading byte order mark goes before the CSV reader sees the
		// first field: after it, a quoted first field would be a bare
		// quote (PowerShell's Export-Csv writes both)
		src = skipBOM(g)
	}
	switch feed.CSV.Encoding {
	case partners.EncodingISO88591:
		src = charmap.ISO8859_1.NewDecoder().Reader(g)
	case partners.EncodingWindows1252:
		// undefined bytes decode to U+FFFD, refused below as invalid
		src = charmap.Windows1252.NewDecoder().Reader(g)
	}
	rl := &recordLimit{r: src, max: int64(RecordBytes(feed)), next: 1, from: 1, comma: []byte(feed.CSV.Delimiter), maxFields: MaxFields(feed), columns: len(feed.Columns)}
	c := csv.NewReader(rl)
	c.Comma, _ = utf8.DecodeRuneInString(feed.CSV.Delimiter)
	c.FieldsPerRecord = -1
	c.ReuseRecord = true
	rl.csv = c
	rd := &Reader{feed: feed, csv: c, guard: g, rec: rl, maxRows: maxRows,
		decoded: feed.CSV.Encoding != partners.EncodingUTF8}
	for _, col := range feed.Columns {
		rd.checks = append(rd.checks, newCheck(col))
	}
	rd.row.Values = make([]string, len(feed.Columns))
	rd.row.Null = make([]bool, len(feed.Columns))
	if feed.CSV.HasHeader() {
		rec, err := rd.read()
		if errors.Is(err, io.EOF) {
			return nil, &FileError{Reason: reason.EmptyFile, Detail: "no header line"}
		}
		if err != nil {
			return nil, rd.fileError(err, 1)
		}
		if err := rd.checkHeader(rec); err != nil {
			return nil, err
		}
	}
	return rd, nil
}

func (r *Reader) checkHeader(rec []string) error {
	want := make([]string, len(r.feed.Columns))
	for i, c := range r.feed.Columns {
		want[i] = c.Name
	}
	got := make([]string, len(rec))
	seen := map[string]bool{}
	for i, h := range rec {
		got[i] = strings.TrimSpace(h)
		if seen[got[i]] {
			return &FileError{Reason: reason.HeaderMismatch, Line: 1, Detail: fmt.Sprintf("header column %d repeats an earlier name", i+1)}
		}
		seen[got[i]] = true
	}
	for i, w := range want {
		if !seen[w] {
			return &FileError{Reason: reason.HeaderMismatch, Line: 1, Detail: fmt.Sprintf("declared column %q is missing from the header", w)}
		}
		if i >= len(got) || got[i] != w {
			return &FileError{Reason: reason.HeaderMismatch, Line: 1, Detail: fmt.Sprintf("declared column %q is not at position %d of the header", w, i+1)}
		}
	}
	if len(got) != len(want) {
		return &FileError{Reason: reason.HeaderMismatch, Line: 1, Detail: fmt.Sprintf("header has %d columns, %d declared", len(got), len(want))}
	}
	return nil
}

// read returns the next record.
func (r *Reader) read() ([]string, error) {
	rec, err := r.csv.Read()
	if err == nil {
		err = r.rec.done()
	} else {
		r.rec.done()
	}
	return rec, err
}

// skipBOM reads r without a leading UTF-8 byte order mark.
func skipBOM(r io.Reader) io.Reader {
	b := bufio.NewReader(r)
	if head, err := b.Peek(3); err == nil && string(head) == "\uFEFF" {
		b.Discard(3)
	}
	return b
}

// MaxFields bounds the fields of one record: the CSV reader keeps about
// 40 bytes for each field of a record, so a line of empty fields (4 M
// commas within the 4 MiB line bound) would hold some 160 MiB before the
// record could be refused for its field count. Twice the declared columns
// and 64 more leaves rows with stray trailing delimiters to be rejected
// one by one (field_count) and fails only a file no feed describes.
func MaxFields(feed *partners.Feed) int { return 2*len(feed.Columns) + 64 }

// Next returns the next data row, io.EOF after the last, or a *FileError.
func (r *Reader) Next() (*Row, error) {
	rec, err := r.read()
	row := &r.row
	row.Line = r.guard.line
	if err == nil && len(rec) > 0 {
		line, _ := r.csv.FieldPos(0)
		row.Line = int64(line)
	}
	row.Index = r.next
	row.Issue = nil
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		var pe *csv.ParseError
		if errors.As(err, &pe) && r.guard.err == nil && r.rec.err == nil {
			// A syntax error spoils one record; the reader resumes at the
			// next line, so the row is rejected and the file goes on.
			r.next++
			if r.maxRows > 0 && r.next > r.maxRows {
				return nil, &FileError{Reason: reason.TooManyRows, Line: int64(pe.StartLine), Detail: fmt.Sprintf("more than %d rows", r.maxRows)}
			}
			row.Line = int64(pe.StartLine)
			row.Issue = &Issue{Line: row.Line, Reason: reason.CSVSyntax}
			return row, nil
		}
		return nil, r.fileError(err, row.Line)
	}
	r.next++
	if r.maxRows > 0 && r.next > r.maxRows {
		return nil, &FileError{Reason: reason.TooManyRows, Line: row.Line, Detail: fmt.Sprintf("more than %d rows", r.maxRows)}
	}
	if len(rec) != len(r.checks) {
		row.Issue = &Issue{Line: row.Line, Reason: reason.FieldCount}
		return row, nil
	}
	for i, cell := range rec {
		if r.guard.nonASCII && (!utf8.ValidString(cell) || (r.decoded && strings.ContainsRune(cell, utf8.RuneError))) {
			return nil, &FileError{Reason: reason.InvalidEncoding, Line: row.Line,
				Detail: fmt.Sprintf("column %q is not valid %s", r.feed.Columns[i].Name, r.feed.CSV.Encoding)}
		}
		if len(cell) > r.feed.CSV.MaxFieldBytes {
			row.Issue = &Issue{Line: row.Line, Column: r.feed.Columns[i].Name, Reason: reason.FieldTooLong}
			return row, nil
		}
		v, null, why := r.checks[i](cell)
		if why != "" {
			row.Issue = &Issue{Line: row.Line, Column: r.feed.Columns[i].Name, Reason: why}
			return row, nil
		}
		row.Values[i], row.Null[i] = v, null
	}
	return row, nil
}

func (r *Reader) fileError(err error, line int64) error {
	var fe *FileError
	if errors.As(err, &fe) {
		return fe
	}
	if r.guard.err != nil {
		return r.guard.err
	}
	if r.rec.err != nil {
		return r.rec.err
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &FileError{Reason: reason.Unreadable, Line: line, Detail: err.Error()}
	}
	// Not the file's: its bytes could not be read (the spool's disk, a
	// download that stopped), which a later attempt may not meet. The
	// caller retries it; held as the partner's, a failing disk would
	// fail every file for good, and the detail would name a local path.
	return fmt.Errorf("rows: read: %w", err)
}

// guard sits under the CSV reader: it refuses NUL bytes (binary content
// under a text name) and physical lines longer than max, so a hostile file
// cannot make the reader buffer an unbounded line.
type guard struct {
	r    io.Reader
	max  int
	run  int // bytes since the last newline
	line int64
	err  *FileError
	// nonASCII: a byte of 0x80 or more has passed. Until one does, every
	// cell the CSV reader makes is ASCII, valid in every encoding a
	// feed declares, and Next does not validate it again.
	nonASCII bool
}

func (g *guard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	b := p[:n]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		g.err = &FileError{Reason: reason.BinaryContent, Line: g.line + int64(bytes.Count(b[:i], []byte{'\n'})), Detail: "NUL byte: not a text file"}
		return 0, g.err
	}
	if !g.nonASCII && !ascii(b) {
		g.nonASCII = true
	}
	if g.run+len(b) <= g.max {
		// no line of b can pass the bound: its lines are counted whole
		if nl := bytes.Count(b, newline); nl > 0 {
			g.line += int64(nl)
			g.run = len(b) - 1 - bytes.LastIndexByte(b, '\n')
		} else {
			g.run += len(b)
		}
		return n, err
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			g.run += len(b)
			break
		}
		g.run += i
		if g.run > g.max {
			break
		}
		g.run = 0
		g.line++
		b = b[i+1:]
	}
	if g.run > g.max {
		g.err = &FileError{Reason: reason.LineTooLong, Line: g.line, Detail: fmt.Sprintf("a line is longer than %d bytes", g.max)}
		return 0, g.err
	}
	return n, err
}

// ascii: no byte of b is 0x80 or more (eight at a time).
func ascii(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b)&0x8080808080808080 != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// recordLimit sits right under the CSV reader (above any decoding) and
// bounds the bytes one record may take while it is being read, not after:
// the CSV reader can pull at most max bytes (plus its read-ahead) past the
// end of the last record it returned, so a quoted field of any size made
// of short lines is refused once it passes max, with the line the record
// started on; it is never buffered whole.
type recordLimit struct {
	r   io.Reader
	csv *csv.Reader
	max int64
	// the delimiters outside quotes since the last line end outside
	// quotes, against maxFields: counted on the bytes handed over, before
	// the CSV reader splits them into fields
	comma     []byte     // the delimiter's UTF-8 bytes
	plain     *[256]bool // plainBytes of comma[0]
	matched   int        // of them, at the end of the bytes so far
	maxFields int
	columns   int
	fields    int
	state     int // of the quoting, where the bytes so far end
	// line starts left before countFields tries a line whole again
	quotedLines int
	from        int64 // the line the counted record starts on
	read        int64 // bytes handed to the CSV reader
	end         int64 // input offset of the end of the last record returned
	lines       int64 // newlines handed to the CSV reader
	endLines    int64 // newlines before end
	tail        []byte
	next        int64 // the line the record being read starts on
	err         *FileError
}

func (l *recordLimit) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	left := l.end + l.max + recordSlack - l.read
	if left <= 0 {
		return 0, l.tooLarge()
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := l.r.Read(p)
	l.read += int64(n)
	if l.countFields(p[:n]) { // counts the lines too
		return n, l.tooManyFields()
	}
	// The last bytes handed over: what the CSV reader has read ahead of
	// the record it returns is among them (see done).
	l.tail = append(l.tail, p[:n]...)
	if len(l.tail) > 2*tailBytes {
		l.tail = append(l.tail[:0], l.tail[len(l.tail)-tailBytes:]...)
	}
	return n, err
}

// tailBytes is how many of the last bytes recordLimit keeps: more than
// the CSV reader's read-ahead.
const tailBytes = 2 * recordSlack

// done is called after each record (or syntax error) the CSV reader
// returns: the next record starts where it ended. It also checks the
// record just read against the bound exactly (the read-ahead allowance
// above lets a record end up to recordSlack bytes past it).
func (l *recordLimit) done() error {
	off, prev := l.csv.InputOffset(), l.end
	size := off - prev
	l.end = off
	if size > l.max && l.err == nil {
		l.tooLarge()
		return l.err
	}
	// the lines before the next record: those of the record just read
	// added to the count at the last one's end, or, for a record longer
	// than the bytes kept, the lines handed over less those read ahead
	tail := int64(len(l.tail))
	if since := l.read - prev; since <= tail {
		l.endLines += int64(bytes.Count(l.tail[tail-since:tail-(l.read-off)], newline))
		l.next = l.endLines + 1
	} else if ahead := l.read - off; ahead <= tail {
		l.endLines = l.lines - int64(bytes.Count(l.tail[tail-ahead:], newline))
		l.next = l.endLines + 1
	}
	return nil
}

var newline = []byte{'\n'}

// countFields follows encoding/csv's quoting over b and counts the
// delimiters outside quotes; it reports whether a record passed
// maxFields. A quote opens a quoted field only at a field's start; in
// one, a doubled quote is a quote and a single one closes it; a quote
// anywhere else (a bare quote, or text after a closing one) is a syntax
// error that ends the record at its line, as the CSV reader does.
func (l *recordLimit) countFields(b []byte) bool {
	if l.plain == nil {
		l.plain = plainBytes(l.comma[0])
	}
	for i := 0; i < len(b); i++ {
		// A line (or the rest of b) with no quote, met outside quotes
		// with a one-byte delimiter, is counted whole: its delimiters
		// are all outside quotes. Tried once a line, at its start, and
		// not on the next quotedRun lines after a line that had quotes.
		if len(l.comma) == 1 && (l.state == fieldStart || l.state == unquoted) && (i == 0 || b[i-1] == '\n') {
			if l.quotedLines > 0 {
				l.quotedLines--
			} else if n, ok := l.plainLine(b[i:]); ok {
				if i += n; i == len(b) {
					break
				}
				i-- // the loop's i++
				continue
			} else {
				l.quotedLines = quotedRun
			}
		}
		// Most bytes change nothing: within unquoted text (no delimiter
		// byte matched so far) all but a line end, a quote and the
		// delimiter's first byte; within quotes all but a quote and a
		// line end; after a syntax error all but a line end. Those runs
		// are passed over whole.
		switch {
		case l.state == unquoted && l.matched == 0:
			for i < len(b) && l.plain[b[i]] {
				i++
			}
		case l.state == inQuotes:
			for i < len(b) && b[i] != '"' && b[i] != '\n' {
				i++
			}
		case l.state == skipLine:
			if k := bytes.IndexByte(b[i:], '\n'); k >= 0 {
				i += k
			} else {
				i = len(b)
			}
		}
		if i == len(b) {
			break
		}
		c := b[i]
		if c == '\n' {
			l.lines++
			if l.state == inQuotes {
				continue // a quoted field's line: the record goes on
			}
			l.fields, l.matched, l.from, l.state = 0, 0, l.lines+1, fieldStart
			continue
		}
		switch l.state {
		case skipLine:
			continue
		case inQuotes:
			if c == '"' {
				l.state = quoteEnd
			}
			continue
		case quoteEnd:
			switch {
			case c == '"':
				l.state = inQuotes // a doubled quote
				continue
			case c == '\r':
				continue // CRLF after the closing quote
			case c != l.comma[l.matched]:
				l.state, l.matched = skipLine, 0 // text after a closing quote
				continue
			}
		case fieldStart:
			if c == '"' {
				l.state = inQuotes
				continue
			}
			l.state = unquoted
		case unquoted:
			if c == '"' {
				l.state, l.matched = skipLine, 0 // a bare quote
				continue
			}
		}
		// unquoted text: a delimiter's bytes (UTF-8 synchronises itself:
		// they never start inside another character)
		if c == l.comma[l.matched] {
			if l.matched++; l.matched == len(l.comma) {
				l.matched, l.state = 0, fieldStart
				if l.fields++; l.fields >= l.maxFields {
					return true
				}
			}
			continue
		}
		l.matched = 0
		if c == l.comma[0] {
			l.matched = 1
		}
		if l.state == quoteEnd {
			l.state = skipLine
		}
	}
	return false
}

// quotedRun is how many lines countFields reads byte by byte after one
// with quotes (a file that quotes its fields quotes them on every line).
const quotedRun = 64

// plainLine counts the delimiters of b's first line, or of all of b
// when it holds no line end, when that holds no quote and stays under
// maxFields, and returns the bytes it took (the line end included);
// false leaves the state as it was, for the byte loop.
func (l *recordLimit) plainLine(b []byte) (int, bool) {
	seg := b
	k := bytes.IndexByte(b, '\n')
	if k >= 0 {
		seg = b[:k]
	}
	if bytes.IndexByte(seg, '"') >= 0 {
		return 0, false
	}
	c := bytes.Count(seg, l.comma)
	if l.fields+c >= l.maxFields {
		return 0, false
	}
	if k >= 0 {
		l.lines++
		l.fields, l.from, l.state = 0, l.lines+1, fieldStart
		return k + 1, true
	}
	l.fields += c
	if n := len(seg); n > 0 {
		l.state = unquoted
		if seg[n-1] == l.comma[0] {
			l.state = fieldStart
		}
	}
	return len(seg), true
}

// plainBytes is the bytes unquoted text passes over without a change of
// countFields' state: all but a line end, a quote and delim, the
// delimiter's first byte.
func plainBytes(delim byte) *[256]bool {
	var t [256]bool
	for i := range t {
		t[i] = true
	}
	t['\n'], t['"'], t[delim] = false, false, false
	return &t
}

// the quoting countFields follows
const (
	fieldStart = iota
	unquoted
	inQuotes
	quoteEnd // a quote in a quoted field: its end, or the first of two
	skipLine // a syntax error: the CSV reader resumes at the next line
)

func (l *recordLimit) tooManyFields() error {
	if l.err == nil {
		l.err = &FileError{Reason: reason.RecordTooLarge, Line: l.from,
			Detail: fmt.Sprintf("a record has more than %d fields; the feed declares %d columns", l.maxFields, l.columns)}
	}
	return l.err
}

func (l *recordLimit) tooLarge() error {
	if l.err == nil {
		l.err = &FileError{Reason: reason.RecordTooLarge, Line: l.next,
			Detail: fmt.Sprintf("a record (quoted fields spanning lines included) is longer than %d bytes", l.max)}
	}
	return l.err
}
