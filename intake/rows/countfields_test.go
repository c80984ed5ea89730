package rows

import "testing"

// countFieldsByte is countFields one byte at a time, with no run passed
// over whole: the reference FuzzCountFields holds countFields to.
func countFieldsByte(l *recordLimit, b []byte) bool {
	for _, c := range b {
		if c == '\n' {
			l.lines++
			if l.state == inQuotes {
				continue
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
				l.state = inQuotes
				continue
			case c == '\r':
				continue
			case c != l.comma[l.matched]:
				l.state, l.matched = skipLine, 0
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
				l.state, l.matched = skipLine, 0
				continue
			}
		}
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

// FuzzCountFields: over any bytes, split anywhere, with a one-byte or a
// multi-byte delimiter, countFields ends in the state the byte-at-a-time
// reference does and reports the same bound passed.
func FuzzCountFields(f *testing.F) {
	for _, seed := range []string{
		"a,b,c\n\"x,\"\"y\"\"\",z\n",
		"a,\"b\nc\",d\r\n\"e\"f,g\n",
		"a;;b;;\"c;;d\";;e\n",
		",,,,,,,,\n",
		"\"unterminated,a,b\n,c",
	} {
		f.Add([]byte(seed), uint8(3), false)
		f.Add([]byte(seed), uint8(1), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint8, multi bool) {
		comma := []byte{','}
		if multi {
			comma = []byte(";;")
		}
		fast := &recordLimit{comma: comma, maxFields: 5}
		ref := &recordLimit{comma: comma, maxFields: 5}
		n := int(split%16) + 1
		var gotFast, gotRef bool
		for p := data; len(p) > 0 && !gotFast && !gotRef; {
			k := min(len(p), n)
			gotFast, gotRef = fast.countFields(p[:k]), countFieldsByte(ref, p[:k])
			p = p[k:]
		}
		type end struct {
			passed                 bool
			state, matched, fields int
			lines, from            int64
		}
		a := end{gotFast, fast.state, fast.matched, fast.fields, fast.lines, fast.from}
		b := end{gotRef, ref.state, ref.matched, ref.fields, ref.lines, ref.from}
		if a != b {
			t.Fatalf("countFields ends %+v, byte at a time %+v", a, b)
		}
	})
}
