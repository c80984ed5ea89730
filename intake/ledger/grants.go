package ledger

import (
	_ "embed"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// GrantsTemplate is grants.sql: the rights of the daemon's, the ops and
// the purge role on the ledger, as psql variables (:"daemon_role", …)
// that Grants fills in. It is shipped as is for psql -v.
//
//go:embed grants.sql
var GrantsTemplate string

// GrantRoles names what grants.sql grants on and to.
type GrantRoles struct {
	Database string // the database intake's tables are in
	Schema   string // the ledger's schema (migrations.Schema)
	Daemon   string // `intake run`'s role
	Ops      string // the ops commands' role (a group of people, best)
	Purge    string // `intake purge`'s role
	// FourEyes: the database refuses an approval by whoever released or
	// requested the file (intake_ops_policy).
	FourEyes bool
}

// Grants is grants.sql with r's names in place of its variables, each
// quoted as an SQL identifier. It refuses a name that cannot be one
// (QuoteIdent) and the same role for two jobs: one role would hold the
// rights of both, and the audit's db_user could not tell them apart.
func Grants(r GrantRoles) (string, error) {
	vars := map[string]string{"database": r.Database, "schema": r.Schema,
		"daemon_role": r.Daemon, "ops_role": r.Ops, "purge_role": r.Purge}
	quoted := map[string]string{}
	for k, v := range vars {
		q, err := QuoteIdent(v)
		if err != nil {
			return "", fmt.Errorf("%s: %w", k, err)
		}
		quoted[k] = q
	}
	if r.Daemon == r.Ops || r.Daemon == r.Purge || r.Ops == r.Purge {
		return "", fmt.Errorf("the daemon's, the ops and the purge role must be three roles (got %s, %s, %s)",
			quoted["daemon_role"], quoted["ops_role"], quoted["purge_role"])
	}
	var pairs, blanks []string
	for k, q := range quoted {
		pairs = append(pairs, `:"`+k+`"`, q)
		blanks = append(blanks, `:"`+k+`"`, "")
	}
	fourEyes := fmt.Sprintf("'%t'", r.FourEyes) // psql's :'var', a literal
	pairs = append(pairs, `:'four_eyes'`, fourEyes)
	blanks = append(blanks, `:'four_eyes'`, "")
	if rest := strings.NewReplacer(blanks...).Replace(GrantsTemplate); strings.Contains(rest, `:"`) || strings.Contains(rest, ` :'`) {
		i := max(strings.Index(rest, `:"`), strings.Index(rest, ` :'`))
		return "", fmt.Errorf("grants.sql: a variable without a value at %q", rest[i:min(len(rest), i+30)])
	}
	out := strings.NewReplacer(pairs...).Replace(GrantsTemplate)
	return out, nil
}

// QuoteIdent is name as a quoted SQL identifier ("a""b" for a"b), as
// psql's :"var" writes it. It refuses what PostgreSQL would not keep as
// given: an empty name, one longer than 63 bytes (NAMEDATALEN - 1: it
// would be truncated to another name), one that is not valid UTF-8, and
// control or format characters (a name that prints as another).
func QuoteIdent(name string) (string, error) {
	switch {
	case name == "":
		return "", fmt.Errorf("an empty name")
	case len(name) > 63:
		return "", fmt.Errorf("%q is longer than 63 bytes", name)
	case !utf8.ValidString(name):
		return "", fmt.Errorf("%q is not valid UTF-8", name)
	}
	for _, c := range name {
		if unicode.IsControl(c) || unicode.In(c, unicode.Cf, unicode.Zl, unicode.Zp) {
			return "", fmt.Errorf("%q holds a control or format character", name)
		}
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`, nil
}
