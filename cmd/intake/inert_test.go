package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// hasRaw reports whether out holds a character a terminal acts on or
// that shows text other than it is: ESC, another C0 control but the
// newline, a C1 control, a bidirectional override.
func hasRaw(out string) bool {
	return strings.ContainsAny(out, "\x1b\x07\r\u0085\u009b\u202e\u2066")
}

// A key is text the partner chooses, shown on the screen an approver
// decides from: `plan show` prints it escaped, so `K-1` followed by
// "cursor up, erase line" cannot rewrite the counts printed above it, and
// a bidirectional override or C1 control cannot reorder or hide what
// follows.
func TestPlanShowPrintsAPartnersKeyEscaped(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "pesc")
	cfg := writeConfigOpts(t, site, cfgOpts{feedExtra: "        approval: {always: true}\n"})
	site.Drop(t, "orders-1.csv", testenv.OrdersHeader+
		"K-1\x1b[1A\x1b[2Kdeletes 0,c1@example.com,10.00,paid,2026-11-01T10:00:00Z,1\n"+
		"K-2\u202e\u0085\u009b2J,c2@example.com,20.00,paid,2026-11-01T10:00:00Z,2\n")
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d\n%s", code, out)
	}
	fs := testenv.Files(t, pool, "pesc")
	if len(fs) != 1 || fs[0].State != "awaiting_approval" {
		t.Fatalf("files %+v, want one awaiting approval", fs)
	}
	code, out := runCLI("plan", "show", strconv.FormatInt(fs[0].ID, 10), "--config", cfg)
	if code != 0 || !regexp.MustCompile(`creates\s+2\n`).MatchString(out) {
		t.Fatalf("plan show %d:\n%s", code, out)
	}
	if hasRaw(out) {
		t.Fatalf("plan show printed a partner's control or format character raw:\n%q", out)
	}
	for _, want := range []string{`K-1\x1b[1A\x1b[2Kdeletes 0`, `K-2\u202e\u0085\u009b2J`} {
		if !strings.Contains(out, want) {
			t.Fatalf("plan show does not print the key as %s:\n%s", want, out)
		}
	}
}

// A cell's old and new values are printed quoted and escaped: the quotes
// show where a value ends, whatever it holds.
func TestPlanShowPrintsCellValuesQuotedAndEscaped(t *testing.T) {
	s := "a\x1b[2K\" -> \"b\xff\u202e\\"
	if got, want := textOrNull(&s), `"a\x1b[2K\" -> \"b\xff\u202e\\"`; got != want {
		t.Fatalf("textOrNull(%q) = %s, want %s", s, got, want)
	}
	if got := textOrNull(nil); got != "NULL" {
		t.Fatalf("textOrNull(nil) = %s", got)
	}
}

// An abandoned upload in incoming/ and an entry left in ready/ are named
// by the partner: their findings (stale_upload, unclaimable_ready) name
// them escaped, once, both where `intake reconcile --once` prints them and
// where `intake status` prints the stored findings.
func TestStatusPrintsAStaleUploadsNameEscaped(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "sesc")
	old := time.Now().Add(-7 * time.Hour)
	for _, rel := range []string{"incoming/orders\x1b]0;pwned\x07\x1b[2K\u202e.csv.part", "ready/orders-\x1b[2K.csv"} {
		p := filepath.Join(site.Root, rel)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	want := []string{"stale_upload", `incoming/orders\x1b]0;pwned\x07\x1b[2K\u202e.csv.part:`,
		"unclaimable_ready", `ready/orders-\x1b[2K.csv:`, "not claimed: bad_name"}
	for _, args := range [][]string{{"reconcile", "--once"}, {"status"}} {
		code, out := runCLI(append(args, "--config", cfg)...)
		if code != 1 || hasRaw(out) {
			t.Fatalf("%s: %d, a raw control character:\n%q", args[0], code, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Fatalf("%s does not print %s:\n%s", args[0], w, out)
			}
		}
	}
}
