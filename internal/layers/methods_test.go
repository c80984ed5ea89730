package layers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxMethods is the most methods a type of the module's code may have: a
// type with more does more than one job, and is split by concern into
// types it embeds (intake/ledger's Ledger, say).
const maxMethods = 30

// methodCounts counts the methods declared on each type of the module's
// non-test code, by package folder and type ("intake/ledger.Ledger"). A
// method declared in two files built under different tags counts once.
func methodCounts(t *testing.T, root string) map[string]int {
	t.Helper()
	names := map[string]map[string]bool{}
	fset := token.NewFileSet()
	forEachGoFile(t, root, func(p, dir string) {
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			typ := receiverType(fn.Recv.List[0].Type)
			if typ == "" {
				continue
			}
			key := dir + "." + typ
			if names[key] == nil {
				names[key] = map[string]bool{}
			}
			names[key][fn.Name.Name] = true
		}
	})
	out := map[string]int{}
	for k, ms := range names {
		out[k] = len(ms)
	}
	return out
}

// forEachGoFile calls fn with the path of every non-test Go file of the
// module below root and its package folder, relative to root with
// slashes ("intake/ledger"; "." for the root); hidden folders, testdata
// and vendor are left out.
func forEachGoFile(t *testing.T, root string, fn func(path, dir string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		fn(p, filepath.ToSlash(dir))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// receiverType is the name of a receiver's type: T for T, *T, T[X] and
// *T[X].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

func TestNoTypeHasTooManyMethods(t *testing.T) {
	counts := methodCounts(t, filepath.Join("..", ".."))
	if counts["intake/ledger.Ledger"] == 0 || counts["partners/sftpconn.Session"] == 0 {
		t.Fatalf("the count found no methods of Ledger or Session: it reads the wrong tree (%d types)", len(counts))
	}
	var over []string
	for k, n := range counts {
		if n > maxMethods {
			over = append(over, k)
		}
	}
	sort.Strings(over)
	for _, k := range over {
		t.Errorf("%s has %d methods, more than %d: split it by concern into types it embeds", k, counts[k], maxMethods)
	}
}
