package intake_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// name255 is a legal file name of exactly 255 bytes: orders-<batch>-,
// filler of r (ASCII or multi-byte UTF-8), then ext.
func name255(t *testing.T, batch, r, ext string) string {
	t.Helper()
	head := "orders-" + batch + "-"
	room := 255 - len(head) - len(ext)
	fill := strings.Repeat(r, room/len(r)) + strings.Repeat("x", room%len(r))
	n := head + fill + ext
	if len(n) != 255 || !utf8.ValidString(n) {
		t.Fatalf("test name of %d bytes", len(n))
	}
	return n
}

// Names of exactly 255 bytes, ASCII and multi-byte UTF-8, through the
// daemon on OpenSSH: a file that must be held lands in quarantine/ with its
// reason file and a receipt, a good one is archived with its receipt; every
// name intake wrote fits in 255 bytes.
func TestNamesOf255BytesAreHeldAndAccepted(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "long")
	f := testenv.OrdersFeed()
	f.Pattern = `orders-([A-Za-z0-9]{1,16})-.*`
	f.BatchID = partners.BatchIDRule{From: partners.BatchFromRegex, Group: 1}
	site.Config.Feeds = []partners.Feed{f}
	bad := "order_id,email\nE-1,a@b.io\n" // header mismatch: failed_terminal, held
	cases := map[string]struct{ content, state string }{
		name255(t, "HA", "a", ".csv"):                      {bad, "failed_terminal"},
		name255(t, "HU", "é", ".csv"):                      {bad, "failed_terminal"},
		name255(t, "HE", "€", ""):                          {bad, "failed_terminal"},
		name255(t, "AA", "a", ".csv"):                      {testenv.OrdersCSV("A", 2), "archived"},
		name255(t, "AU", "𝄞", ".csv"):                      {testenv.OrdersCSV("U", 2), "archived"},
		name255(t, "AX", "b", "."+strings.Repeat("e", 60)): {testenv.OrdersCSV("X", 2), "archived"},
	}
	for n, c := range cases { // written under a short name, renamed: name.part would be too long
		part := filepath.Join(site.Root, "incoming", "up.part")
		if err := os.WriteFile(part, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(part, filepath.Join(site.Root, "ready", n)); err != nil {
			t.Fatal(err)
		}
	}
	r := newRig(t, pool, "w1", site)
	r.poll("long")
	r.poll("long")

	got := files(t, pool, "long")
	if len(got) != len(cases) {
		t.Fatalf("%d files, want %d: %+v", len(got), len(cases), got)
	}
	for _, fr := range got {
		c, ok := cases[fr.Name]
		if !ok || fr.State != c.state {
			t.Fatalf("%q: %s/%s, want %s", fr.Name, fr.State, fr.Reason, c.state)
		}
		rc := receipt(t, site, fr.Receipt)
		if rc.File != fr.Name || rc.IntakeID != fr.ID {
			t.Fatalf("receipt of %q: %+v", fr.Name, rc)
		}
		if c.state == "archived" {
			if rc.Outcome != "accepted" || rc.Rows.Applied != 2 || rc.Archive == "" {
				t.Fatalf("receipt %+v", rc)
			}
			continue
		}
		if rc.Outcome != "failed" || rc.Reason != "header_mismatch" || rc.Quarantine == "" {
			t.Fatalf("receipt %+v", rc)
		}
		rel, _ := filepath.Rel(site.Root, rc.Quarantine+".reason.json")
		if !strings.Contains(site.Read(t, rel), `"reason": "header_mismatch"`) {
			t.Fatalf("reason file %s", rel)
		}
	}
	if n := len(site.Files(t, "quarantine")); n != 6 {
		t.Fatalf("quarantine/ holds %d files, want 3 held files and their 3 reason files", n)
	}
	for _, dir := range []string{"quarantine", "reports", "archive", "processing", "ready"} {
		for _, p := range site.Files(t, dir) {
			if b := filepath.Base(p); len(b) > 255 || !utf8.ValidString(b) || strings.HasPrefix(b, ".") {
				t.Fatalf("%s/%s: %d bytes", dir, p, len(b))
			}
		}
	}
	if n := len(site.Files(t, "ready")); n != 0 {
		t.Fatalf("%d files left in ready/", n)
	}
	testenv.AssertExactOrders(t, pool, "long", 2, "A", "U", "X")
}
