package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"sort"
	"strconv"
	"testing"
)

// faultPoints lists where the module's non-test code names each fault
// point (internal/fault: fault.Check("step")), by name: "file:line".
func faultPoints(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	forEachGoFile(t, root, func(p, _ string) {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Check" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "fault" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out[name] = append(out[name], fset.Position(lit.Pos()).String())
			return true
		})
	})
	return out
}

// Each fault point is one step of the protocol, set in one place: a step
// that a variant (a group of small files, the apply ahead, another ops
// command) takes too is the same function taking an option, so a crash
// test that stops at the point stops every path there.
func TestEachFaultPointIsSetOnce(t *testing.T) {
	points := faultPoints(t, "../..")
	if len(points) < 20 {
		t.Fatalf("found %d fault points, want the pipeline's (20 or more): the search is broken", len(points))
	}
	var names []string
	for name := range points {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if at := points[name]; len(at) > 1 {
			t.Errorf("fault point %q is set in %d places: %v", name, len(at), at)
		}
	}
}
