package intake_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// An exact resend in manifest mode is decided from its manifest alone: the
// data file is never read. Proof: the resend's bytes are garbage of the
// same length (binary, so any read of them would fail the file or
// conflict the batch), yet it ends duplicate, archived with its receipt,
// with no byte downloaded. A resend whose listed size differs from the
// bound file's, or whose manifest states other bytes, is read as before.
func TestManifestExactResendIsDecidedWithoutReadingTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mdup")
	site.Config.Readiness = partners.ReadinessManifest
	r := newRig(t, pool, "w1", site)

	good := goodRows("MD", 3)
	manifest := func(n int, sum string) string {
		return fmt.Sprintf(`{"bytes": %d, "sha256": %q, "rows": 3}`, n, sum)
	}
	site.Drop(t, "orders-md.csv", good)
	site.Drop(t, "orders-md.csv.complete", manifest(len(good), sha(good)))
	r.poll("mdup")
	bytes := func() float64 { return testutil.ToFloat64(r.d.Metrics().Bytes.WithLabelValues("mdup")) }
	before := bytes()
	if before != float64(len(good)) {
		t.Fatalf("downloaded %v bytes for the first file, want %d", before, len(good))
	}

	// The resend: its manifest states the bound bytes, the file on the
	// site is garbage of the same length.
	garbage := strings.Repeat("\x00", len(good))
	site.Drop(t, "orders-md.csv", garbage)
	site.Drop(t, "orders-md.csv.complete", manifest(len(good), sha(good)))
	staged := intake.StagedReceipts()
	r.poll("mdup")

	fs := files(t, pool, "mdup")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "duplicate" || fs[1].Reason != "duplicate" {
		t.Fatalf("got %+v, want archived then duplicate", fs)
	}
	if got := bytes(); got != before {
		t.Fatalf("the resend downloaded %v bytes, want none", got-before)
	}
	if got := testutil.ToFloat64(r.d.Metrics().HashOnly.WithLabelValues("mdup", "manifest")); got != 1 {
		t.Fatalf("resends decided from the manifest: %v, want 1", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1`, fs[1].ID); n != 0 {
		t.Fatalf("the duplicate applied %d chunks", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'mdup' AND last_intake_id = $1`, fs[0].ID); n != 3 {
		t.Fatalf("%d rows still written by the original, want 3", n)
	}
	rc := receipt(t, site, fs[1].Receipt)
	if rc.Outcome != ledger.OutcomeDuplicate || rc.DuplicateOf != fs[0].ID || !strings.Contains(rc.Detail, "not read") {
		t.Fatalf("duplicate receipt %+v", rc)
	}
	// archived as it lies on the site, beside its manifest
	if got := site.Files(t, "archive"); len(got) != 4 {
		t.Fatalf("archive holds %v, want both files and both manifests", got)
	}
	if got := site.Read(t, strings.TrimPrefix(fs[1].Archive, site.Root+"/")); got != garbage {
		t.Fatal("the archived resend is not the bytes on the site")
	}
	// its manifest moved beside it, under its archive name, and its
	// receipt went out through the temporary file opened at its claim
	if got := site.Read(t, strings.TrimPrefix(fs[1].Archive+partners.ManifestSuffix, site.Root+"/")); got != manifest(len(good), sha(good)) {
		t.Fatalf("the resend's manifest beside its archive holds %q", got)
	}
	if n := intake.StagedReceipts() - staged; n != 1 {
		t.Fatalf("%d receipts published through a temporary file opened ahead, want the resend's", n)
	}

	// A listed size other than the bound file's is read: the manifest
	// states the bound bytes, the file is longer, so they disagree.
	longer := good + "MD-9,x\n"
	site.Drop(t, "orders-md.csv", longer)
	site.Drop(t, "orders-md.csv.complete", manifest(len(good), sha(good)))
	// A manifest of a batch no intake holds is read as before.
	other := goodRows("MX", 3)
	site.Drop(t, "orders-mx.csv", other)
	site.Drop(t, "orders-mx.csv.complete", manifest(len(other), sha(other)))
	r.poll("mdup")
	byName := map[string]fileRow{}
	for _, f := range files(t, pool, "mdup")[2:] {
		byName[f.Name] = f
	}
	if f := byName["orders-md.csv"]; f.State != "quarantined" || f.Reason != "manifest_mismatch" {
		t.Fatalf("a resend of another size: %+v, want read and quarantined manifest_mismatch", f)
	}
	if f := byName["orders-mx.csv"]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("a new batch: %+v, want read and archived", f)
	}
	if got := testutil.ToFloat64(r.d.Metrics().HashOnly.WithLabelValues("mdup", "manifest")); got != 1 {
		t.Fatalf("resends decided from the manifest: %v, want still 1", got)
	}
}

// A manifest the site fails to read (here a directory stands in its place
// when the file's run reads it: OpenSSH opens it and fails the READ) is
// the file's transient error: the file is not held as manifest_invalid,
// and its next attempt, once the manifest is back, reads it and ends the
// file.
func TestAManifestTheSiteFailsToReadIsReadAgain(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mfr")
	site.Config.Readiness = partners.ReadinessManifest
	r := newRig(t, pool, "w1", site)
	good := goodRows("MR", 3)
	site.Drop(t, "orders-mr.csv", good)
	site.Drop(t, "orders-mr.csv.complete", fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, len(good), sha(good)))
	resume := r.pollPaused("mfr", "download:manifest")
	man := filepath.Join(site.Root, "processing", "w1", "orders-mr.csv.complete")
	if err := os.Rename(man, man+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(man, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = resume() // what the poll returns is not the point
	fs := files(t, pool, "mfr")
	if len(fs) != 1 || fs[0].State != "claimed" {
		t.Fatalf("after the failed read: %+v, want the file still claimed (not held as manifest_invalid)", fs)
	}
	if err := os.Remove(man); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(man+".away", man); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET next_attempt_at = now() WHERE partner_id = 'mfr'`); err != nil {
		t.Fatal(err)
	}
	r.poll("mfr")
	fs = files(t, pool, "mfr")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("after its next attempt: %+v, want archived", fs)
	}
	testenv.AssertExactOrders(t, pool, "mfr", 3, "MR")
}
