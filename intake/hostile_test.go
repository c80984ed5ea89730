package intake_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
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
	must(os.WriteFile(filepath.Join(ready, "orders-\u202evsc.exe"), []byte("x"), 0o644)) // shows as orders-exe.csv
	must(os.WriteFile(filepath.Join(ready, "orders-\u200b1.csv"), []byte("x"), 0o644))   // shows as orders-1.csv
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
		if rc.Outcome != "quarantined" || string(rc.Reason) != f.Reason || rc.Detail == "" {
			t.Fatalf("receipt %+v", rc)
		}
		if strings.ContainsAny(rc.File, "\x01\xff\u202e\u200b") {
			t.Fatalf("a control or format character or invalid byte travelled into the receipt: %q", rc.File)
		}
	}
	want := map[string]int{"not_regular_file": 2, "bad_name": 2, "deceptive_name": 2, "no_feed": 1}
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
		if strings.ContainsAny(q, "\x01\xff\u202e\u200b") {
			t.Fatalf("a hostile name entered our paths: %q", q)
		}
	}
	// held whatever they are: the symlink and the directory went to
	// quarantine/ too, and a later poll finds nothing to take again
	if ents, _ := os.ReadDir(filepath.Join(site.Root, "processing", "w1")); len(ents) != 0 {
		t.Fatalf("processing/w1 still holds %d entries", len(ents))
	}
	r.poll("hostile")
	if n := len(files(t, pool, "hostile")); n != 8 {
		t.Fatalf("%d intakes after a second poll, want the 8 of the first", n)
	}
	testenv.AssertExactOrders(t, pool, "hostile", 3, "G")
}

// A corpus of hostile contents through the whole pipeline: each file gets
// its exact reason code and a receipt saying why, nothing of it is applied,
// and another partner's file in the same cycle is served.
func TestHostileContentsThroughThePipeline(t *testing.T) {
	_, pool := testenv.DB(t)
	bad := testenv.NewSite(t, "evil")
	good := testenv.NewSite(t, "kind")
	cases := map[string]struct {
		content, state, reason string
		rejects                string // expected rejects.csv body, when rows were rejected
	}{
		"orders-utf8.csv":   {header + "E-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1\nE-2,\xff\xfe@b.io,1.00,paid,2026-11-01T00:00:00Z,1\n", "failed_terminal", "invalid_encoding", ""},
		"orders-binary.csv": {"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "failed_terminal", "binary_content", ""},
		"orders-header.csv": {"order_id,email,amount,status,placed_at,qty,extra\nE-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1,x\n", "failed_terminal", "header_mismatch", ""},
		"orders-ragged.csv": {header + "E-1,a@b.io\nE-2,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1,extra\n", "quarantined", "reject_rate_exceeded", "line,column,reason,outcome,detail\n2,,field_count,rejected,\n3,,field_count,rejected,\n"},
		"orders-formula.csv": {header + "=HYPERLINK(\"http://x\"),a@b.io,1.00,paid,2026-11-01T00:00:00Z,1\n=1+2,a@b.io,1.00,paid,2026-11-01T00:00:00Z,@SUM(1)\n",
			"quarantined", "reject_rate_exceeded", "line,column,reason,outcome,detail\n2,,csv_syntax,rejected,\n3,qty,not_integer,rejected,\n"},
		"orders-empty.csv": {"", "failed_terminal", "empty_file", ""},
	}
	for name, c := range cases {
		bad.Drop(t, name, c.content)
	}
	good.Drop(t, "orders-fine.csv", testenv.OrdersCSV("F", 3))
	r := newRig(t, pool, "w1", bad, good)
	r.poll("evil")
	r.poll("kind")

	got := files(t, pool, "evil")
	if len(got) != len(cases) {
		t.Fatalf("%d files, want %d", len(got), len(cases))
	}
	for _, f := range got {
		c := cases[f.Name]
		if f.State != c.state || f.Reason != c.reason {
			t.Fatalf("%s: %s/%s, want %s/%s", f.Name, f.State, f.Reason, c.state, c.reason)
		}
		rc := receipt(t, bad, f.Receipt)
		if string(rc.Reason) != c.reason || rc.Detail == "" {
			t.Fatalf("%s: receipt %+v", f.Name, rc)
		}
		if c.rejects != "" {
			rel, _ := filepath.Rel(bad.Root, f.Rejects)
			if body := bad.Read(t, rel); body != c.rejects {
				t.Fatalf("%s: rejects.csv\n%s\nwant\n%s", f.Name, body, c.rejects)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'evil'`); n != 0 {
		t.Fatalf("%d rows of hostile files applied", n)
	}
	if fs := files(t, pool, "kind"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("the other partner: %+v", fs)
	}
}

// A regular file listed in ready/ and swapped for a symbolic link before
// its claim (one SFTP account serving two partners: partner "alpha" points
// its link at partner "beta"'s file) is claimed as the link itself and
// refused on the claimed path's own attributes: held as not_regular_file
// with a receipt, nothing of it applied under alpha's id, and beta's file
// untouched in beta's ready/, where beta's own poll lands it. The swap is
// made while the poll waits between its listing and its claim; a lone
// file goes through the per-file claim (RENAME with the OPEN behind it), a
// pair of small files through a group's claim and read.
func TestASymlinkSwappedInAfterTheListingIsHeldUnread(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alpha []string // dropped into alpha's ready/; the last is swapped
	}{
		{"alone", []string{"orders-a1.csv"}},
		{"in a group", []string{"orders-a0.csv", "orders-a1.csv"}}, // a0 holds keys C-*
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, pool := testenv.DB(t)
			alpha := testenv.NewSite(t, "alpha")
			beta := testenv.NewSite(t, "beta")
			if alpha.Config.SFTP.Address != beta.Config.SFTP.Address || alpha.Config.SFTP.User != beta.Config.SFTP.User {
				t.Fatal("the two partners must share one SFTP account")
			}
			// the same size as alpha's file, so no size check tells them apart
			betaBody := testenv.OrdersCSV("B", 3)
			beta.Drop(t, "orders-b1.csv", betaBody)
			for i, name := range tc.alpha {
				prefix := "C"
				if i == len(tc.alpha)-1 {
					prefix = "A"
				}
				alpha.Drop(t, name, testenv.OrdersCSV(prefix, 3))
			}
			swapped := tc.alpha[len(tc.alpha)-1]
			betaFile := filepath.Join(beta.Root, "ready", "orders-b1.csv")

			r := newRig(t, pool, "w1", alpha, beta)
			resume := r.pollPaused("alpha", "claim:before_rename")
			link := filepath.Join(alpha.Root, "ready", swapped)
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(betaFile, link); err != nil {
				t.Fatal(err)
			}
			if err := resume(); err != nil {
				t.Fatalf("alpha's poll: %v", err)
			}

			held := 0
			for _, f := range files(t, pool, "alpha") {
				if f.Name != swapped {
					if f.State != "archived" {
						t.Fatalf("alpha's own file: %+v", f)
					}
					continue
				}
				held++
				if f.State != "quarantined" || f.Reason != "not_regular_file" {
					t.Fatalf("the swapped-in link: %s/%s, want quarantined/not_regular_file (%+v)", f.State, f.Reason, f)
				}
				if rc := receipt(t, alpha, f.Receipt); rc.Outcome != "quarantined" || rc.Reason != "not_regular_file" || rc.Detail == "" {
					t.Fatalf("receipt %+v", rc)
				}
				// like a hostile entry, it can only be discarded
				err := ops.Release(context.Background(), pool, ops.Decision{IntakeID: f.ID, Actor: "alice", Reason: "looks fine",
					Partners: []string{"alpha"}, Worker: intake.OpsWorker("ops")})
				if !errors.Is(err, ledger.ErrDecision) {
					t.Fatalf("releasing the held link: %v, want a refusal", err)
				}
			}
			if held != 1 {
				t.Fatalf("%d rows of alpha for %s, want 1", held, swapped)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'alpha' AND order_id LIKE 'B-%'`); n != 0 {
				t.Fatalf("%d of beta's rows landed under alpha's id", n)
			}
			if len(tc.alpha) > 1 {
				testenv.AssertExactOrders(t, pool, "alpha", 3, "C")
			} else {
				testenv.AssertExactOrders(t, pool, "alpha", 0)
			}
			if fi, err := os.Lstat(betaFile); err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("beta's file left its ready/: %v, %v", fi, err)
			}
			if b, _ := os.ReadFile(betaFile); string(b) != betaBody {
				t.Fatalf("beta's file changed: %q", b)
			}

			r.poll("beta")
			got := files(t, pool, "beta")
			if len(got) != 1 || got[0].State != "archived" {
				t.Fatalf("beta's own poll: %+v", got)
			}
			testenv.AssertExactOrders(t, pool, "beta", 3, "B")
		})
	}
}

// Readiness manifest: a manifest swapped for a symlink between the
// listing and the claim (to a manifest that would pass, elsewhere on the
// site) is not read: the LSTAT sent with its read finds the link, and the
// file fails for good, manifest_invalid, saying why; nothing is applied.
func TestAManifestSwappedForASymlinkIsNotRead(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mlink")
	site.Config.Readiness = partners.ReadinessManifest
	body := testenv.OrdersCSV("ML", 3)
	manifest := fmt.Sprintf(`{"bytes": %d, "sha256": %q, "rows": 3}`, len(body), sha(body))
	site.Drop(t, "orders-m.csv", body)
	site.Drop(t, "orders-m.csv.complete", manifest)
	elsewhere := filepath.Join(site.Root, "incoming", "looks-right.complete")
	if err := os.WriteFile(elsewhere, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, pool, "w1", site)
	resume := r.pollPaused("mlink", "claim:before_rename")
	link := filepath.Join(site.Root, "ready", "orders-m.csv.complete")
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	if err := resume(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	fs := files(t, pool, "mlink")
	if len(fs) != 1 || fs[0].State != "failed_terminal" || fs[0].Reason != "manifest_invalid" || fs[0].Applied != 0 {
		t.Fatalf("files %+v, want the file failed for good as manifest_invalid, nothing applied", fs)
	}
	if rc := receipt(t, site, fs[0].Receipt); !strings.Contains(rc.Detail, "not a regular file") {
		t.Fatalf("receipt %+v, want it to say the manifest is not a regular file", rc)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'mlink'`); n != 0 {
		t.Fatalf("%d rows applied", n)
	}
	if got, err := os.ReadFile(elsewhere); err != nil || string(got) != manifest {
		t.Fatalf("the link's target changed: %q, %v", got, err)
	}
}
