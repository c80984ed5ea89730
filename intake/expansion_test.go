package intake_test

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A compressed file that expands to more than limits.max_expansion_ratio
// times its compressed size is held archive_too_large while it streams,
// far below limits.max_expanded_bytes (1 MiB of zeros gzips about 1000
// to 1); a file within the ratio lands.
func TestACompressedFileOverTheExpansionRatioIsHeld(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "ratio")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	header := testenv.OrdersCSV("R", 0)
	bomb := append([]byte(header), bytes.Repeat([]byte{'\n'}, 1<<20)...) // a header, then 1 MiB of blank lines
	site.Drop(t, "orders-bomb.csv.gz", string(gz(t, bomb)))
	site.Drop(t, "orders-good.csv.gz", string(gz(t, []byte(testenv.OrdersCSV("G", 20)))))
	r := newRig(t, pool, "w1", site)
	r.poll("ratio")

	got := map[string]string{}
	for _, f := range files(t, pool, "ratio") {
		got[f.Name] = f.State + "/" + f.Reason
		if f.Name == "orders-bomb.csv.gz" {
			if rc := receipt(t, site, f.Receipt); !strings.Contains(rc.Detail, "times its") {
				t.Errorf("the bomb's receipt does not name the ratio: %+v", rc)
			}
		}
	}
	if got["orders-bomb.csv.gz"] != "quarantined/archive_too_large" || got["orders-good.csv.gz"] != "archived/" {
		t.Fatalf("got %v, want the bomb quarantined archive_too_large and the good file archived", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'ratio'`); n != 20 {
		t.Fatalf("%d rows, want the good file's 20", n)
	}
}

// The spool's free space is looked at while a file expands into it, not
// only at the claim: below spool.min_free_bytes mid-expansion the
// expansion stops and the file is retried later (not held: the disk is
// not the file's fault); with room again it lands.
func TestASpoolDiskFillingDuringExpansionDefersTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "spoolfull")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv(\.gz)?`
	site.Config.Feeds[0].Compression = []string{partners.CompressionGzip}
	site.Drop(t, "orders-a.csv.gz", string(gz(t, []byte(testenv.OrdersCSV("S", 30)))))
	r := newRig(t, pool, "w1", site)

	// claimed with room; the disk "fills" (the floor rises above its free
	// space) while the file downloads, before it expands
	resume := r.pollPaused("spoolfull", "download:mid")
	intake.SetSpoolMinFree(r.d, math.MaxInt64)
	if err := resume(); err != nil {
		t.Logf("poll: %v", err)
	}
	fs := files(t, pool, "spoolfull")
	if len(fs) != 1 || fs[0].State == "archived" || fs[0].State == "quarantined" || fs[0].State == "failed_terminal" {
		t.Fatalf("after the spool filled mid-expansion: %+v, want the file claimed and waiting for a retry", fs)
	}
	var lastErr string
	var attempts int
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(last_error, ''), attempts FROM file_intake WHERE partner_id = 'spoolfull'`).Scan(&lastErr, &attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || !strings.Contains(lastErr, "free-space floor") {
		t.Fatalf("attempts %d, last_error %q: want one transient attempt naming the spool's free-space floor", attempts, lastErr)
	}

	intake.SetSpoolMinFree(r.d, 1)
	r.poll("spoolfull")
	if fs := files(t, pool, "spoolfull"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("with room again: %+v, want the file archived", fs)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'spoolfull'`); n != 30 {
		t.Fatalf("%d rows, want 30", n)
	}
}

// Decryption into the spool looks at its free space as expansion does:
// below spool.min_free_bytes mid-decryption the file is retried later,
// and lands once there is room.
func TestASpoolDiskFillingDuringDecryptionDefersTheFile(t *testing.T) {
	_, pool := testenv.DB(t)
	dir := t.TempDir()
	t.Setenv("INTAKE_TEST_PGP_PASS", "correct horse")
	us, partner := pgpEntity(t, "intake"), pgpEntity(t, "partner")
	secretFile := filepath.Join(dir, "intake.asc")
	writeSecret(t, secretFile, us, "correct horse")
	site := testenv.NewSite(t, "pgpfull")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv\.pgp`
	site.Config.Feeds[0].PGP = &partners.PGP{PrivateKeyFile: secretFile, PassphraseEnv: "INTAKE_TEST_PGP_PASS"}
	site.Drop(t, "orders-a.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("E", 12)), us, partner, false)))
	r := newRig(t, pool, "w1", site)

	resume := r.pollPaused("pgpfull", "download:mid")
	intake.SetSpoolMinFree(r.d, math.MaxInt64)
	if err := resume(); err != nil {
		t.Logf("poll: %v", err)
	}
	var state, lastErr string
	if err := pool.QueryRow(t.Context(), `SELECT state::text, coalesce(last_error, '') FROM file_intake WHERE partner_id = 'pgpfull'`).Scan(&state, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state == "archived" || state == "quarantined" || state == "failed_terminal" || !strings.Contains(lastErr, "free-space floor") {
		t.Fatalf("after the spool filled mid-decryption: state %s, last_error %q; want the file waiting for a retry, the floor named", state, lastErr)
	}
	intake.SetSpoolMinFree(r.d, 1)
	r.poll("pgpfull")
	if fs := files(t, pool, "pgpfull"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 12 {
		t.Fatalf("with room again: %+v, want the file archived with its 12 rows", fs)
	}
}
