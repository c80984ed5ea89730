package intake_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Entries of ready/ that can never be processed are moved to quarantine/
// without being read, each with a reason the partner can see; benign ones
// (uploads in progress, dotfiles) are left alone, and the partner's good
// files go on.
func TestHostileEntriesAreQuarantinedWithAReason(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "hostile")
	ready := filepath.Join(site.Root, "ready")
	secret := filepath.Join(t.TempDir(), "secret.csv")
	os.WriteFile(secret, []byte("do not read"), 0o644)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(secret, filepath.Join(ready, "orders-link.csv")))
	must(os.WriteFile(filepath.Join(ready, "orders-\x01ctl.csv"), []byte("x"), 0o644))
	must(os.WriteFile(filepath.Join(ready, "orders-\xff\xfe.csv"), []byte("x"), 0o644))
	must(os.WriteFile(filepath.Join(ready, "invoice.pdf"), []byte("%PDF"), 0o644))
	must(os.Mkdir(filepath.Join(ready, "orders-dir.csv"), 0o755))
	must(os.WriteFile(filepath.Join(ready, ".hidden.csv"), []byte("x"), 0o644))
	must(os.WriteFile(filepath.Join(ready, "orders-up.csv.part"), []byte("x"), 0o644))
	site.Drop(t, "orders-good.csv", testenv.OrdersCSV("G", 3))

	r := newRig(t, pool, "w1", site)
	r.poll("hostile")

	reasons := map[string]int{}
	for _, f := range files(t, pool, "hostile") {
		if f.Name == "orders-good.csv" {
			if f.State != "archived" {
				t.Fatalf("the good file: %+v", f)
			}
			continue
		}
		if f.State != "quarantined" {
			t.Fatalf("%+v: want quarantined", f)
		}
		reasons[f.Reason]++
		rc := receipt(t, site, f.Receipt)
		if rc.Outcome != "quarantined" || rc.Reason != f.Reason || rc.Detail == "" {
			t.Fatalf("receipt %+v", rc)
		}
		if strings.ContainsAny(rc.File, "\x01\xff") {
			t.Fatalf("a control character or invalid byte travelled into the receipt: %q", rc.File)
		}
	}
	want := map[string]int{"not_regular_file": 2, "bad_name": 2, "no_feed": 1}
	for k, v := range want {
		if reasons[k] != v {
			t.Fatalf("reasons %v, want %v", reasons, want)
		}
	}
	left := site.Files(t, "ready")
	sort.Strings(left)
	if len(left) != 2 || left[0] != ".hidden.csv" || left[1] != "orders-up.csv.part" {
		t.Fatalf("ready/ holds %v, want only the dotfile and the upload in progress", left)
	}
	if b, _ := os.ReadFile(secret); string(b) != "do not read" {
		t.Fatal("the symlink's target was touched")
	}
	for _, q := range site.Files(t, "quarantine") {
		if strings.ContainsAny(q, "\x01\xff") {
			t.Fatalf("a hostile name entered our paths: %q", q)
		}
	}
	testenv.AssertExactOrders(t, pool, "hostile", 3, "G")
}
