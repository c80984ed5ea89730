package target

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/partners"
)

// A target table may refuse a value the feed's row check accepted: a
// varchar(8) for a column declared max_length 64, a smallint for an
// integer, NOT NULL for an optional column. At run time such a value fails
// its chunk; Compare finds what can be decided from the catalog
// before any file arrives, so that `intake check` names it.

// Finding is one way a target table may refuse what a feed accepts.
type Finding struct {
	// Column is the feed's column, or a target column the feed does not
	// write; "" for the table as a whole.
	Column string
	// Fail: a value the feed accepts would be refused (or silently
	// changed). Otherwise a warning: a constraint that cannot be decided
	// from the declarations (CHECK, foreign key, another unique index, a
	// trigger).
	Fail   bool
	Detail string
}

func (f Finding) String() string {
	if f.Column == "" {
		return f.Detail
	}
	return "column " + f.Column + ": " + f.Detail
}

// Feed-side widths, in characters, of the canonical text a column's values
// take (rows.newCheck writes them).
const (
	emailMaxChars     = 254                                   // rows.validEmail
	dateChars         = len("2006-01-02")                     // rows: t.Format("2006-01-02")
	timestampMaxChars = len("2006-01-02T15:04:05.999999999Z") // RFC3339Nano in UTC
)

// Compare compares each column of a partner's feed with its column
// in the target table, as the catalog describes them: type, length,
// precision and scale, NOT NULL, and the constraints, unique indexes and
// triggers that bear on them. It returns the target's loading error
// (missing table, column or unique index) as Load would.
func Compare(ctx context.Context, db *pgxpool.Pool, partner string, f *partners.Feed) ([]Finding, error) {
	if _, err := Load(ctx, db, f); err != nil {
		return nil, err
	}
	return NewChecker(db).Compare(ctx, partner, f)
}

// Checker compares feeds with their target tables as Compare does, reading
// each table's catalog (columns, enum labels, constraints, indexes,
// triggers) once: a daemon whose thousand partners write one table reads
// it once for their comparisons at its start, not a thousand times
// (docs/performance.md; the mapping's own load, Cache.Get, is
// once per distinct mapping). It holds what it read: one Checker serves
// one check.
type Checker struct {
	db     *pgxpool.Pool
	tables map[string]*tableFacts // by the feed's target, as written
}

// tableFacts is what the catalog says of a target table.
type tableFacts struct {
	tt          *catalogTable
	labels      map[uint32][]string // enum labels by type
	constraints []constraint
}

// NewChecker returns a Checker on db.
func NewChecker(db *pgxpool.Pool) *Checker {
	return &Checker{db: db, tables: map[string]*tableFacts{}}
}

// Compare is Compare for a feed whose target loads (Load or Cache.Get
// said so first); a feed column the table lacks is an error here.
func (c *Checker) Compare(ctx context.Context, partner string, f *partners.Feed) ([]Finding, error) {
	tf, ok := c.tables[f.Target]
	if !ok {
		tt, err := describe(ctx, c.db, f.Target)
		if err != nil {
			return nil, err
		}
		tf = &tableFacts{tt: tt}
		if tf.labels, err = enumLabels(ctx, c.db, tt); err != nil {
			return nil, err
		}
		if tf.constraints, err = readConstraints(ctx, c.db, tt); err != nil {
			return nil, err
		}
		c.tables[f.Target] = tf
	}
	if tf.tt.cols["partner_id"] == nil {
		return nil, &Error{Table: f.Target, Detail: "missing column partner_id (text)"}
	}
	for _, col := range f.Columns {
		if tf.tt.cols[col.Name] == nil {
			return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("missing column %s declared by feed %s", col.Name, f.Name)}
		}
	}
	return compareWith(tf, partner, f), nil
}

// compareWith is Compare over what the catalog said of the table.
func compareWith(tf *tableFacts, partner string, f *partners.Feed) []Finding {
	tt, labels := tf.tt, tf.labels
	var out []Finding
	add := func(col string, fail bool, format string, args ...any) {
		out = append(out, Finding{Column: col, Fail: fail, Detail: fmt.Sprintf(format, args...)})
	}
	if pc := tt.cols["partner_id"]; pc.category != "S" || pc.enum {
		add("partner_id", true, "is %s: the partner id is written as text", pc.typ)
	} else if n := stringLimit(pc); n >= 0 && n < utf8.RuneCountInString(partner) {
		add("partner_id", true, "is %s: partner id %q has %d characters", pc.typ, partner, utf8.RuneCountInString(partner))
	}
	for i := range f.Columns {
		c := &f.Columns[i]
		tc := tt.cols[c.Name]
		switch {
		case tc.generated:
			add(c.Name, true, "is a generated column: no value can be written to it")
			continue
		case tc.identity:
			add(c.Name, true, "is GENERATED ALWAYS AS IDENTITY: a written value is refused")
			continue
		}
		if tc.notNull && !c.Required {
			add(c.Name, true, "is NOT NULL but the feed column is not required: an empty cell would be refused (declare required: true, or drop NOT NULL)")
		}
		for _, d := range compareType(c, tc, labels[tc.base]) {
			out = append(out, Finding{Column: c.Name, Fail: d.fail, Detail: d.detail})
		}
	}
	for _, n := range tt.order {
		tc := tt.cols[n]
		if n == "partner_id" || n == "last_intake_id" || n == HashColumn || f.Column(n) != nil {
			continue
		}
		if tc.notNull && !tc.hasDefault {
			add(n, true, "is NOT NULL without a default and the feed does not write it: every new row would be refused")
		}
	}
	if _, ok := tt.cols[HashColumn]; !ok && len(f.Key) < len(f.Columns) {
		add("", false, "has no column %s bigint: edits made outside intake are not told and the next file for the key overwrites them (ALTER TABLE … ADD COLUMN %s bigint; see docs/target-tables.md)", HashColumn, HashColumn)
	}
	return append(out, constraintWarnings(tf.constraints, tt, f)...)
}

// typeFinding is one finding of compareType.
type typeFinding struct {
	fail   bool
	detail string
}

// compareType decides whether every value a feed column accepts, in the
// canonical text the row check writes (or its binary encoding), is taken
// by the target column's type unchanged. labels are the target's enum
// labels when its type is an enum.
func compareType(c *partners.Column, tc *catalogColumn, labels []string) []typeFinding {
	var out []typeFinding
	fail := func(format string, args ...any) {
		out = append(out, typeFinding{fail: true, detail: fmt.Sprintf(format, args...)})
	}
	warn := func(format string, args ...any) {
		out = append(out, typeFinding{detail: fmt.Sprintf(format, args...)})
	}
	incompatible := func() {
		fail("is %s: a %s value is not valid input of that type (type incompatibility)", tc.typ, c.Type)
	}
	switch {
	case tc.enum:
		if c.Type != partners.TypeEnum {
			fail("is %s, an enum type: a %s value need not be one of its labels", tc.typ, c.Type)
			break
		}
		var missing []string
		for _, v := range c.Values {
			if !slices.Contains(labels, v) {
				missing = append(missing, v)
			}
		}
		if len(missing) > 0 {
			fail("is %s, an enum type without the feed's values %s", tc.typ, strings.Join(missing, ", "))
		}
	case tc.category == "S":
		limit := stringLimit(tc)
		if w := feedWidth(c); limit >= 0 && w > limit {
			fail("is %s: holds %d characters, the feed accepts up to %d (%s)", tc.typ, limit, w, widthHint(c))
		}
	case tc.baseName == "int2" || tc.baseName == "int4" || tc.baseName == "int8":
		if c.Type != partners.TypeInteger && c.Type != partners.TypeDecimal {
			incompatible()
			break
		}
		if c.Type == partners.TypeDecimal && c.Scale > 0 {
			fail("is %s: a decimal with digits after the point (scale %d) is refused (declare scale: 0, or use numeric)", tc.typ, c.Scale)
			break
		}
		digits := map[string]int{"int2": 4, "int4": 9, "int8": 18}[tc.baseName]
		if c.Type == partners.TypeInteger && tc.baseName == "int8" {
			digits = partners.MaxIntegerDigits // the row check parses a bigint
		}
		if d := c.IntegerDigits(); d > digits {
			fail("is %s: out of range for values of %d digits, which the feed accepts (declare precision: %d or less, or widen the column)", tc.typ, d, digits)
		}
	case tc.baseName == "numeric":
		if c.Type != partners.TypeInteger && c.Type != partners.TypeDecimal {
			incompatible()
			break
		}
		if tc.typmod < 4 {
			break // numeric without precision holds any value the feed accepts
		}
		p, s := numericTypmod(tc.typmod)
		scale := 0
		if c.Type == partners.TypeDecimal {
			scale = c.Scale
		}
		if scale > s {
			fail("is %s: rounds to %d digits after the point, the feed accepts %d (scale %d)", tc.typ, s, scale, scale)
		}
		if d := c.IntegerDigits(); d > p-s {
			hint := fmt.Sprintf("declare precision: %d or less", p-s+scale)
			if c.Precision == 0 && c.Type == partners.TypeDecimal {
				hint = fmt.Sprintf("the feed column has no precision; declare precision: %d or less", p-s+scale)
			}
			fail("is %s: holds %d digits before the point, the feed accepts %d (%s)", tc.typ, p-s, d, hint)
		}
	case tc.baseName == "float4" || tc.baseName == "float8":
		switch c.Type {
		case partners.TypeDecimal:
			warn("is %s: decimal values are rounded to binary floating point", tc.typ)
			if tc.baseName == "float4" && c.IntegerDigits() > 38 {
				fail("is %s: out of range for values of %d digits, which the feed accepts (declare precision)", tc.typ, c.IntegerDigits())
			}
		case partners.TypeInteger:
		default:
			incompatible()
		}
	case tc.baseName == "date":
		switch c.Type {
		case partners.TypeDate:
		case partners.TypeTimestamp:
			warn("is %s: the time of day of a timestamp is dropped", tc.typ)
		default:
			incompatible()
		}
	case tc.baseName == "timestamptz" || tc.baseName == "timestamp":
		switch c.Type {
		case partners.TypeTimestamp:
		case partners.TypeDate:
			if tc.baseName == "timestamptz" {
				warn("is %s: a date lands as midnight in the session's time zone", tc.typ)
			}
		default:
			incompatible()
		}
	default:
		incompatible()
	}
	return out
}

// numericTypmod unpacks numeric(p,s) (a scale is 11 bits, signed, since
// PostgreSQL 15).
func numericTypmod(typmod int32) (p, s int) {
	v := int(typmod - 4)
	p, s = (v>>16)&0xffff, v&0x7ff
	if s&0x400 != 0 {
		s -= 0x800
	}
	return p, s
}

// stringLimit is the most characters a string column holds, or -1.
func stringLimit(tc *catalogColumn) int {
	if (tc.baseName == "varchar" || tc.baseName == "bpchar") && tc.typmod >= 4 {
		return int(tc.typmod - 4)
	}
	return -1
}

// feedWidth is the most characters a value of the column takes as text.
func feedWidth(c *partners.Column) int {
	switch c.Type {
	case partners.TypeText:
		return c.MaxLength
	case partners.TypeEmail:
		return emailMaxChars
	case partners.TypeEnum:
		w := 0
		for _, v := range c.Values {
			w = max(w, utf8.RuneCountInString(v))
		}
		return w
	case partners.TypeInteger:
		return 1 + c.IntegerDigits() // with a sign
	case partners.TypeDecimal:
		w := 1 + max(c.IntegerDigits(), 1)
		if c.Scale > 0 {
			w += 1 + c.Scale
		}
		return w
	case partners.TypeDate:
		return dateChars
	case partners.TypeTimestamp:
		return timestampMaxChars
	}
	return 0
}

// widthHint says where the feed's width comes from.
func widthHint(c *partners.Column) string {
	switch c.Type {
	case partners.TypeText:
		return fmt.Sprintf("max_length %d; without max_length a text column accepts %d", c.MaxLength, partners.DefaultTextMaxLen)
	case partners.TypeEmail:
		return "an email address may have 254 characters"
	case partners.TypeEnum:
		return "its longest value"
	case partners.TypeInteger, partners.TypeDecimal:
		return "its sign, digits and point; declare precision to bound them"
	}
	return "its canonical text form"
}

// enumLabels reads the labels of the target's enum column types.
func enumLabels(ctx context.Context, db *pgxpool.Pool, tt *catalogTable) (map[uint32][]string, error) {
	var oids []uint32
	for _, c := range tt.cols {
		if c.enum {
			oids = append(oids, c.base)
		}
	}
	out := map[uint32][]string{}
	if len(oids) == 0 {
		return out, nil
	}
	rs, err := db.Query(ctx, `SELECT enumtypid, enumlabel FROM pg_enum WHERE enumtypid = ANY($1::oid[])`, oids)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", tt.ident.Sanitize(), err)
	}
	defer rs.Close()
	for rs.Next() {
		var o uint32
		var l string
		if err := rs.Scan(&o, &l); err != nil {
			return nil, err
		}
		out[o] = append(out[o], l)
	}
	return out, rs.Err()
}

// constraint is a constraint, unique index or row trigger of a target
// table, or a CHECK of one of its columns' domains (readConstraints).
type constraint struct {
	kind    string   // c CHECK, f foreign key, x exclusion, u unique index, d domain CHECK, t trigger
	name    string   // of the constraint, index or trigger
	on      []string // its columns; for d, the domain's name
	ref     string   // f: the table referenced
	partial bool     // u: an expression or partial index
	domain  uint32   // d: the domain's type
}

// readConstraints reads what of a target table may refuse a row but
// cannot be decided from the declarations: CHECK, foreign-key and
// exclusion constraints, unique indexes, the CHECKs of its columns'
// domains, and row triggers.
func readConstraints(ctx context.Context, db *pgxpool.Pool, tt *catalogTable) ([]constraint, error) {
	var domains []uint32
	for _, c := range tt.cols {
		if c.domain != "" {
			domains = append(domains, c.oid)
		}
	}
	rs, err := db.Query(ctx, `
		SELECT c.contype::text, c.conname::text,
		       array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey) ORDER BY a.attnum),
		       coalesce(c.confrelid::regclass::text, ''), false, 0::oid
		FROM pg_constraint c
		WHERE c.conrelid = $1 AND c.contype IN ('c', 'f', 'x')
		UNION ALL
		SELECT 'u', i.indexrelid::regclass::text,
		       array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) ORDER BY a.attname),
		       '', i.indexprs IS NOT NULL OR i.indpred IS NOT NULL, 0::oid
		FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique
		UNION ALL
		SELECT 'd', c.conname::text, array[t.typname::text], '', false, c.contypid
		FROM pg_constraint c JOIN pg_type t ON t.oid = c.contypid
		WHERE c.contypid = ANY($2::oid[]) AND c.contype = 'c'
		UNION ALL
		SELECT 't', t.tgname::text, array[]::text[], '', false, 0::oid
		FROM pg_trigger t WHERE t.tgrelid = $1 AND NOT t.tgisinternal AND t.tgenabled <> 'D'
		ORDER BY 1, 2`, tt.oid, domains)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", tt.ident.Sanitize(), err)
	}
	defer rs.Close()
	var out []constraint
	for rs.Next() {
		var c constraint
		if err := rs.Scan(&c.kind, &c.name, &c.on, &c.ref, &c.partial, &c.domain); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rs.Err()
}

// constraintWarnings names the constraints that bear on a feed: those on
// its columns (and CHECKs of their domains), unique indexes other than
// (partner_id, key...) that involve them, and row triggers.
func constraintWarnings(cs []constraint, tt *catalogTable, f *partners.Feed) []Finding {
	cols := []string{"partner_id"}
	for _, c := range f.Columns {
		cols = append(cols, c.Name)
	}
	keyIndex := append([]string{"partner_id"}, f.Key...)
	slices.Sort(keyIndex)
	var out []Finding
	for _, k := range cs {
		name, on := k.name, k.on
		var mine []string
		for _, c := range on {
			if slices.Contains(cols, c) {
				mine = append(mine, c)
			}
		}
		warn := func(format string, args ...any) {
			out = append(out, Finding{Column: strings.Join(mine, ", "), Detail: fmt.Sprintf(format, args...)})
		}
		const undecided = "may refuse rows the feed accepts; not decidable from the declarations"
		switch k.kind {
		case "c":
			if len(mine) > 0 || len(on) == 0 {
				warn("CHECK constraint %s %s", name, undecided)
			}
		case "f":
			if len(mine) > 0 {
				warn("foreign key %s references %s: %s", name, k.ref, undecided)
			}
		case "x":
			if len(mine) > 0 {
				warn("exclusion constraint %s %s", name, undecided)
			}
		case "u":
			sorted := slices.Sorted(slices.Values(on))
			if !k.partial && slices.Equal(sorted, keyIndex) {
				continue // the key's own index: a repeat there is a row update
			}
			if len(mine) > 0 || k.partial {
				warn("unique index %s other than (partner_id, %s) %s", name, strings.Join(f.Key, ", "), undecided)
			}
		case "d":
			mine = nil
			for _, c := range f.Columns {
				if tc := tt.cols[c.Name]; tc.domain != "" && tc.oid == k.domain {
					mine = append(mine, c.Name)
				}
			}
			if len(mine) > 0 { // a domain of a column the feed does not write
				warn("CHECK constraint %s of domain %s %s", name, on[0], undecided)
			}
		case "t":
			warn("trigger %s may refuse or change rows; not decidable from the declarations", name)
		}
	}
	return out
}
