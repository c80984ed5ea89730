package ledger_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// guideTables reads the reason tables of docs/partner-guide.md: the
// table after a paragraph starting "Skip reasons", "Row reasons" or "File
// reasons", each row's code (the first `code` of its first cell) with its
// meaning (the second cell).
func guideTables(t *testing.T, guide string) map[reason.Kind]map[reason.Code]string {
	t.Helper()
	tables := map[reason.Kind]map[reason.Code]string{}
	var kind reason.Kind
	for _, line := range strings.Split(guide, "\n") {
		switch {
		case strings.HasPrefix(line, "Skip reasons"):
			kind = reason.KindSkip
		case strings.HasPrefix(line, "Row reasons"):
			kind = reason.KindRow
		case strings.HasPrefix(line, "File reasons"):
			kind = reason.KindFile
		case strings.HasPrefix(line, "#"):
			kind = 0
		case kind != 0 && strings.HasPrefix(line, "| `"):
			cells := strings.Split(line, "|")
			if len(cells) < 4 {
				t.Fatalf("a reason row without its meaning: %q", line)
			}
			code, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(cells[1]), "`"), "`")
			if tables[kind] == nil {
				tables[kind] = map[reason.Code]string{}
			}
			tables[kind][reason.Code(code)] = strings.TrimSpace(cells[2])
		}
	}
	return tables
}

// Every reason code (internal/reason's registry: skip, row and file) is
// explained in docs/partner-guide.md, the page ops send to partners, in
// the table of each of its kinds, with its meaning; the guide's reason
// tables name no code the registry lacks. A code added without its row
// there fails here.
func TestEveryReasonIsInThePartnerGuide(t *testing.T) {
	guide, err := os.ReadFile("../../docs/partner-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	tables := guideTables(t, string(guide))
	kinds := []reason.Kind{reason.KindSkip, reason.KindRow, reason.KindFile}
	for _, k := range kinds {
		if len(tables[k]) < 10 {
			t.Fatalf("the guide's %s table has %d codes: is the parse still right?", k, len(tables[k]))
		}
	}
	all := reason.All()
	if len(all) < 70 {
		t.Fatalf("the registry lists %d codes", len(all))
	}
	for _, in := range all {
		for _, k := range kinds {
			if !in.Kind.Has(k) {
				continue
			}
			meaning, ok := tables[k][in.Code]
			switch {
			case !ok:
				t.Errorf("%s reason %s (%s) is not in the guide's %s reasons", k, in.Code, in.Meaning, k)
			case meaning == "":
				t.Errorf("%s reason %s has no meaning in the guide", k, in.Code)
			}
		}
	}
	for _, k := range kinds {
		for code := range tables[k] {
			if in, ok := reason.Lookup(code); !ok || !in.Kind.Has(k) {
				t.Errorf("the guide's %s reasons list %s, which the registry does not declare a %s reason", k, code, k)
			}
		}
	}
}

// Every receipt and row outcome a partner can read is explained in
// docs/partner-guide.md.
func TestEveryOutcomeAPartnerReadsIsInThePartnerGuide(t *testing.T) {
	guide, err := os.ReadFile("../../docs/partner-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{}
	for _, file := range []string{"outcome.go", "../rows/reasons.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				v := s.(*ast.ValueSpec)
				for i, n := range v.Names {
					if !strings.HasPrefix(n.Name, "Outcome") || i >= len(v.Values) {
						continue
					}
					if lit, ok := v.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						code, _ := strconv.Unquote(lit.Value)
						codes[code] = file + " " + n.Name
					}
				}
			}
		}
	}
	if len(codes) < 8 {
		t.Fatalf("found only %d outcomes: is the parse still right?", len(codes))
	}
	for code, where := range codes {
		if !strings.Contains(string(guide), "`"+code+"`") {
			t.Errorf("%s (%s) is not explained in docs/partner-guide.md", code, where)
		}
	}
}
