package sitefile_test

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/partners"
)

// Every name intake generates on a partner's site fits in 255 bytes and
// is valid UTF-8, for partner names and batch ids up to their limits, in
// ASCII and in multi-byte UTF-8; two long names never get the same
// generated name.
func TestEveryGeneratedRemoteNameFits(t *testing.T) {
	names := []string{"orders-a.csv", "x"}
	for n := 240; n <= sitefile.MaxName; n++ {
		names = append(names, "orders-"+strings.Repeat("a", n-len("orders-.csv"))+".csv")
	}
	for _, r := range []string{"é", "€", "𝄞"} { // 2, 3 and 4 bytes
		for pad := 0; pad < 4; pad++ {
			body := strings.Repeat("a", pad) + strings.Repeat(r, (sitefile.MaxName-pad)/len(r))
			names = append(names, body)
		}
	}
	names = append(names, "a."+strings.Repeat("x", 252)) // an "extension" of 253 bytes
	batches := []string{"", "B1", strings.Repeat("b", 128)}
	seen := map[string]string{}
	check := func(kind, in, got string) {
		t.Helper()
		if len(got) > sitefile.MaxName || !utf8.ValidString(got) {
			t.Fatalf("%s of %d-byte input: %d bytes, valid UTF-8 %v: %q", kind, len(in), len(got), utf8.ValidString(got), got)
		}
		if prev, ok := seen[kind+"/"+got]; ok && prev != in {
			t.Fatalf("%s: %q and %q both get %q", kind, prev, in, got)
		}
		seen[kind+"/"+got] = in
	}
	for _, name := range names {
		if !partners.SafeName(name) {
			t.Fatalf("test input %q is not a legal name", name)
		}
		for id := int64(1); id <= 1e12; id *= 1e6 {
			held := sitefile.HeldName(id, name)
			check("held", name, held)
			check("held manifest", name, held+partners.ManifestSuffix)
			check("reason", name, sitefile.ReasonName(held))
			check("temp", name+"tmp", sitefile.TempName(sitefile.ReasonName(held)))
			if !sitefile.IsOurTemp(sitefile.TempName(sitefile.ReasonName(held))) {
				t.Fatalf("the reconciler would not know %q", sitefile.TempName(sitefile.ReasonName(held)))
			}
			for _, b := range batches {
				in := &ledger.Intake{ID: id, RemoteName: name, BatchID: b, SHA256: strings.Repeat("f", 64)}
				key := fmt.Sprintf("%s/%d", b, id) // reports are named by batch and intake id
				check("receipt", key, sitefile.ReportStem(in)+sitefile.ReceiptSuffix)
				check("rejects", key, sitefile.ReportStem(in)+sitefile.RejectsSuffix)
				for i, a := range sitefile.ArchiveNames("/r/archive/2026/12", in, 9) {
					ext := path.Ext(name)
					if len(ext) > sitefile.MaxArchiveExt {
						ext = "" // left out of archive names
					}
					key := fmt.Sprintf("%s/%d/%d/%s", b, id, i, ext)
					check("archive", key, path.Base(a))
					check("archive manifest", key, path.Base(a)+partners.ManifestSuffix)
					if !strings.Contains(a, ".ffffffffffff.") {
						t.Fatalf("archive name lost its hash and id: %q", a)
					}
				}
			}
		}
	}
	// two 255-byte names that differ only at the end stay apart
	a, b := strings.Repeat("a", 254)+"1", strings.Repeat("a", 254)+"2"
	if sitefile.HeldName(7, a) == sitefile.HeldName(7, b) {
		t.Fatal("two long names got one held name")
	}
}

func TestFitNameCutsAtARuneBoundary(t *testing.T) {
	base := strings.Repeat("€", 100) // 300 bytes
	got := sitefile.FitName("12.", base, ".reason.json")
	if len(got) > sitefile.MaxName || !utf8.ValidString(got) || !strings.HasPrefix(got, "12.€") || !strings.HasSuffix(got, ".reason.json") {
		t.Fatalf("%d bytes: %q", len(got), got)
	}
	if short := sitefile.FitName("1.", "a.csv", ".x"); short != "1.a.csv.x" {
		t.Fatalf("a short name was changed: %q", short)
	}
}
