package target

import "github.com/partner-intake/partner-intake/partners"

// When two keys are one. Intake finds a key repeated within a chunk (and
// across a group's files) by the bytes of its normalised values (the row
// check writes integers, decimals, dates and timestamps one way each), and
// only a chunk where it finds one runs the SQL dedupe; a replay's
// unchanged rows are matched by their bytes too. That holds only where the
// target's equality is byte equality of that text: a citext key, a column
// of a nondeterministic collation (ICU level 2: 'X-1' = 'x-1'), a uuid or
// a char(n) written two ways, an integer column fed as text (' 1' = '1')
// are one key to the target and two to intake. A file holding both was
// then merged as two rows (ON CONFLICT ... cannot affect a row twice: the
// file was held for good, or its counts were untrue), and a snapshot
// recorded the key as written, not as stored, and deleted the row it had
// just written.
//
// Such a target (exactKeys false) has every chunk deduplicated in SQL, by
// the target's own equality (keyCast: the column's collation, the target
// type's operators), no look-up of unchanged rows (they go to the merge,
// which compares as the target does), and a snapshot records each key as
// the target stores it.

// keyExact reports whether target column tc compares two values of feed
// column c equal exactly when intake's normalised texts of them are the
// same. tc.deterministic is the collation the key is compared under: the
// unique index's, where it has one of its own (Table.keyEquality).
func keyExact(c partners.Column, tc *catalogColumn) bool {
	if tc.domain != "" {
		return false // a domain may carry its own collation or operators
	}
	if tc.enum {
		return true // a label is the bytes written, or refused
	}
	switch tc.baseName {
	case "text", "varchar":
		// what was staged is what is compared, byte for byte, unless the
		// collation makes other bytes equal, or varchar(n) clips trailing
		// blanks past n ('abc' and 'abc  ' into varchar(3))
		return tc.deterministic && (tc.baseName == "text" || tc.typmod < 4 || feedWidth(&c) <= int(tc.typmod-4))
	case "int2", "int4", "int8":
		return c.Type == partners.TypeInteger || (c.Type == partners.TypeDecimal && c.Scale == 0)
	case "numeric":
		if c.Type != partners.TypeInteger && c.Type != partners.TypeDecimal {
			return false
		}
		if tc.typmod < 4 {
			return true
		}
		_, s := numericTypmod(tc.typmod)
		scale := 0
		if c.Type == partners.TypeDecimal {
			scale = c.Scale
		}
		return scale <= s // no rounding makes two values one
	case "date":
		return c.Type == partners.TypeDate
	case "timestamp", "timestamptz":
		// the row check keeps microseconds: timestamp(p) for p < 6 rounds
		// two of its values into one (a date is midnight either way)
		return c.Type == partners.TypeDate || (c.Type == partners.TypeTimestamp && (tc.typmod < 0 || tc.typmod >= 6))
	}
	return false
}
