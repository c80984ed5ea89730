package ledger_test

import (
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// Grants fills every variable of grants.sql with a quoted identifier and
// refuses names that would not stay what they say, and one role for two
// jobs.
func TestGrantsQuoteEachNameAndRefuseBadOnes(t *testing.T) {
	ok := ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: `we"ird`, Ops: "Ops Team", Purge: "intake_purge"}
	sql, err := ledger.Grants(ok)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sql, `:"`) {
		t.Errorf("a variable left in the grants:\n%s", sql)
	}
	for _, w := range []string{`TO "we""ird";`, `TO "Ops Team";`, `ON DATABASE "intake"`, `"public".intake_audit`} {
		if !strings.Contains(sql, w) {
			t.Errorf("grants lack %s", w)
		}
	}
	bad := []struct {
		name string
		r    ledger.GrantRoles
	}{
		{"an empty role", ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: "", Ops: "o", Purge: "p"}},
		{"a name past 63 bytes", ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: strings.Repeat("d", 64), Ops: "o", Purge: "p"}},
		{"a control character", ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: "d\x1b[2J", Ops: "o", Purge: "p"}},
		{"a format character", ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: "d\u202eevil", Ops: "o", Purge: "p"}},
		{"invalid UTF-8", ledger.GrantRoles{Database: "intake\xff", Schema: "public", Daemon: "d", Ops: "o", Purge: "p"}},
		{"one role for two jobs", ledger.GrantRoles{Database: "intake", Schema: "public", Daemon: "intake", Ops: "o", Purge: "intake"}},
	}
	for _, c := range bad {
		if _, err := ledger.Grants(c.r); err == nil {
			t.Errorf("%s: granted", c.name)
		}
	}
}
