package reason_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// The codes as stored in file_intake.reason, intake_row_issue.reason and
// findings, written to receipts and used as metric labels: a value is
// never renamed, and a code is removed only with its rows' migration.
// Adding a code adds it here.
const stored = `archive_bad_entry archive_directory_too_large archive_entries archive_invalid
archive_nested archive_symlink archive_too_large awaiting_approval bad_batch_id bad_date
bad_email bad_name bad_timestamp batch_conflict binary_content changed_after_claim
compression_not_allowed csv_syntax deceptive_name dotfile duplicate duplicate_key
empty_file exists feed_unconfigured field_count field_too_long file_too_large
header_mismatch hostile_entry ignored_name impossible_name invalid_encoding
line_too_long manifest_file manifest_invalid manifest_mismatch manifest_missing
mapping_changed newer_write no_feed not_decimal not_found not_in_enum not_integer
not_regular_file not_stable outside_edit partial_upload pgp_bad_signature pgp_corrupt
pgp_no_key pgp_not_encrypted pgp_unsigned plan_changed plan_rejected precision_exceeded
record_too_large reject_rate_exceeded remote_lost required_missing retries_exhausted
scale_exceeded size_mismatch superseded target_error target_refused target_unusable
too_long too_many_rows unreadable`

func TestTheStoredValuesDoNotChange(t *testing.T) {
	var got []string
	for _, in := range reason.All() {
		got = append(got, string(in.Code))
	}
	sort.Strings(got)
	want := strings.Fields(stored)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the registry's codes\n%v\nare not the stored ones\n%v", got, want)
	}
}

var snake = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// Each code once, with a kind and a one-line meaning; a value that can be
// a label, a file name part and a SQL literal.
func TestTheRegistryHoldsEachCodeOnce(t *testing.T) {
	seen := map[reason.Code]bool{}
	for _, in := range reason.All() {
		if seen[in.Code] {
			t.Errorf("%s is in the registry twice", in.Code)
		}
		seen[in.Code] = true
		if !snake.MatchString(string(in.Code)) || len(in.Code) > 40 {
			t.Errorf("%q is not a short snake_case code", in.Code)
		}
		if in.Kind == 0 || in.Kind&^(reason.KindSkip|reason.KindRow|reason.KindFile) != 0 {
			t.Errorf("%s has kind %d", in.Code, in.Kind)
		}
		if in.Meaning == "" || strings.Contains(in.Meaning, "\n") {
			t.Errorf("%s: meaning %q is not one line", in.Code, in.Meaning)
		}
		if got, ok := reason.Lookup(in.Code); !ok || got != in {
			t.Errorf("Lookup(%s) = %+v, %v", in.Code, got, ok)
		}
	}
	if _, ok := reason.Lookup("no_such_reason"); ok {
		t.Error("Lookup found a code the registry lacks")
	}
}

// Every Code constant the package declares is in the registry: a code
// declared without its kind and meaning fails here.
func TestEveryDeclaredCodeIsInTheRegistry(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "reason.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[reason.Code]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i, n := range v.Names {
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s is not a string literal", n.Name)
				}
				code, _ := strconv.Unquote(lit.Value)
				if other, dup := declared[reason.Code(code)]; dup {
					t.Errorf("%s and %s declare the same code %s", other, n.Name, code)
				}
				declared[reason.Code(code)] = n.Name
			}
		}
	}
	if len(declared) != len(reason.All()) {
		t.Errorf("%d codes declared, %d in the registry", len(declared), len(reason.All()))
	}
	for code, name := range declared {
		if _, ok := reason.Lookup(code); !ok {
			t.Errorf("%s (%s) is declared but not in the registry", name, code)
		}
	}
}

func TestAKindNamesItsParts(t *testing.T) {
	if got := (reason.KindSkip | reason.KindFile).String(); got != "skip+file" {
		t.Errorf("got %q", got)
	}
	if !(reason.KindSkip | reason.KindFile).Has(reason.KindFile) || reason.KindRow.Has(reason.KindFile) || reason.KindRow.Has(0) {
		t.Error("Has is wrong")
	}
}
