// Package names checks the names intake puts into spool paths, SQL, metric
// labels and environment lookups: partner and worker ids, SQL identifiers
// and targets, environment variable names and sha256 digests. Each rule is
// kept here once (partners, spool and intake used to hold their own
// copies) and written out by hand: as regular expressions with counted
// repetition ({0,62}) they were compiled at every process start, about 6
// ms of package init and 450 KB of heap (docs/performance.md).
// The *Rule constants are the same rules as regular expressions, for
// messages; a test holds each check to its rule.
package names

// The rules, as regular expressions (Go's $ is the end of the text).
const (
	PartnerIDRule = `^[a-z0-9][a-z0-9_-]{0,62}$`
	WorkerIDRule  = `^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`
	IdentRule     = `^[a-z_][a-z0-9_]{0,62}$`
	TargetRule    = `^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`
	EnvNameRule   = `^[A-Za-z_][A-Za-z0-9_.-]{0,127}$`
	SHA256HexRule = `^[0-9a-f]{64}$`
)

// PartnerID reports whether s is a partner id (PartnerIDRule): it becomes
// part of spool paths, metric labels and keys.
func PartnerID(s string) bool {
	return shaped(s, 63, func(c byte) bool { return lower(c) || digit(c) },
		func(c byte) bool { return lower(c) || digit(c) || c == '_' || c == '-' })
}

// WorkerID reports whether s is a worker id (WorkerIDRule): it names
// processing/<worker>/ on partner sites and the spool's temporary files.
func WorkerID(s string) bool {
	return shaped(s, 63, alnum, func(c byte) bool { return alnum(c) || c == '.' || c == '_' || c == '-' })
}

// Ident reports whether s is a lower-case SQL identifier (IdentRule).
func Ident(s string) bool {
	return shaped(s, 63, func(c byte) bool { return lower(c) || c == '_' },
		func(c byte) bool { return lower(c) || digit(c) || c == '_' })
}

// Target reports whether s is a table, optionally schema-qualified
// (TargetRule).
func Target(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return Ident(s[:i]) && Ident(s[i+1:])
		}
	}
	return Ident(s)
}

// TargetSchema is the schema of a target named without one: intake's
// connections search only pg_catalog and the ledger's schema
// (migrations.SearchPath), so an unqualified target is never looked up on
// a path; it is the table in public.
const TargetSchema = "public"

// SplitTarget is a target's schema and table (TargetSchema when s names
// none).
func SplitTarget(s string) (schema, table string) {
	if schema, table, ok := cut(s); ok {
		return schema, table
	}
	return TargetSchema, s
}

func cut(s string) (before, after string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// EnvName reports whether s is an environment variable name (EnvNameRule):
// POSIX's letters, digits and '_', and the '.' and '-' Kubernetes allows.
// A URL, a passphrase with spaces or punctuation is none: settings that
// name a variable holding a secret refuse it without printing it back.
func EnvName(s string) bool {
	return shaped(s, 128, func(c byte) bool { return letter(c) || c == '_' },
		func(c byte) bool { return alnum(c) || c == '_' || c == '.' || c == '-' })
}

// SHA256Hex reports whether s is a sha256 digest in lower-case hex
// (SHA256HexRule).
func SHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !digit(s[i]) && (s[i] < 'a' || s[i] > 'f') {
			return false
		}
	}
	return true
}

// shaped reports whether s has 1 to max bytes, the first one first allows
// and every other one rest allows. Every rule is ASCII: a byte of a
// multi-byte character fails them all.
func shaped(s string, max int, first, rest func(byte) bool) bool {
	if len(s) == 0 || len(s) > max || !first(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !rest(s[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) bool  { return c >= 'a' && c <= 'z' }
func letter(c byte) bool { return lower(c) || (c >= 'A' && c <= 'Z') }
func digit(c byte) bool  { return c >= '0' && c <= '9' }
func alnum(c byte) bool  { return letter(c) || digit(c) }
