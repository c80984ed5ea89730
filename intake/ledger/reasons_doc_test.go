package ledger_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Every reason code and receipt outcome a partner can read in a receipt or a rejects report is
// explained in docs/partner-guide.md, the page ops send to partners: a code
// added without its row there fails here.
func TestEveryCodeAPartnerReadsIsInThePartnerGuide(t *testing.T) {
	guide, err := os.ReadFile("../../docs/partner-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{}
	for _, file := range []string{"reasons.go", "outcome.go", "../rows/reasons.go"} {
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
					if !strings.HasPrefix(n.Name, "Reason") && !strings.HasPrefix(n.Name, "Outcome") || i >= len(v.Values) {
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
	if len(codes) < 30 {
		t.Fatalf("found only %d reason codes: is the parse still right?", len(codes))
	}
	for code, where := range codes {
		if !strings.Contains(string(guide), "`"+code+"`") {
			t.Errorf("%s (%s) is not explained in docs/partner-guide.md", code, where)
		}
	}
}
