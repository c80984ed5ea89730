package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/packet"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A signed PGP file whose plaintext is 512 MiB (zeros, zlib-compressed
// inside the message: a few hundred KiB as sent) is decrypted whole into
// the spool by the real daemon, its signature checked at the end, and only
// then parsed (and failed: binary content), with the daemon's peak RSS
// under 128 MiB: decryption streams. The partner's good PGP file lands
// behind it.
func TestAPGPFileIsDecryptedStreamingByTheRealDaemon(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "pgpmem")
	spoolDir := t.TempDir()
	dir := t.TempDir()
	cfgEnt := &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA}
	us, err := openpgp.NewEntity("intake", "", "intake@example.test", cfgEnt)
	if err != nil {
		t.Fatal(err)
	}
	partner, err := openpgp.NewEntity("partner", "", "partner@example.test", cfgEnt)
	if err != nil {
		t.Fatal(err)
	}
	var sec, pub bytes.Buffer
	if err := us.SerializePrivate(&sec, nil); err != nil {
		t.Fatal(err)
	}
	if err := partner.Serialize(&pub); err != nil {
		t.Fatal(err)
	}
	secFile, pubFile := filepath.Join(dir, "intake.key"), filepath.Join(dir, "partner.pub")
	os.WriteFile(secFile, sec.Bytes(), 0o600)
	os.WriteFile(pubFile, pub.Bytes(), 0o600)

	cfg := memConfig(t, site, spoolDir, "@every 1s", "      max_expanded_bytes: 1073741824")
	raw, _ := os.ReadFile(cfg)
	yaml := strings.Replace(string(raw), `pattern: 'orders-.*\.csv(\.gz)?'`, `pattern: 'orders-.*\.csv\.pgp'`, 1)
	yaml = strings.Replace(yaml, "        compression: [gzip]\n",
		"        pgp:\n          private_key_file: "+secFile+"\n          verify_keys_file: "+pubFile+"\n          require_signature: true\n", 1)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	seal := func(w *bufio.Writer, write func(w interface{ Write([]byte) (int, error) })) {
		ew, err := openpgp.Encrypt(w, []*openpgp.Entity{us}, partner, nil,
			&packet.Config{DefaultCompressionAlgo: packet.CompressionZLIB, CompressionConfig: &packet.CompressionConfig{Level: 9}})
		if err != nil {
			t.Fatal(err)
		}
		write(ew)
		if err := ew.Close(); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, site, "orders-a-big.csv.pgp", 2*time.Minute, func(w *bufio.Writer) {
		seal(w, func(ew interface{ Write([]byte) (int, error) }) {
			zeros := make([]byte, 8<<20)
			for range 64 { // 512 MiB
				ew.Write(zeros)
			}
		})
	})
	publish(t, site, "orders-b-good.csv.pgp", time.Minute, func(w *bufio.Writer) {
		seal(w, func(ew interface{ Write([]byte) (int, error) }) { ew.Write([]byte(testenv.OrdersCSV("G", 50))) })
	})

	p, peak := runUntilFinished(t, url, cfg, pool, "pgpmem", 2)
	want := map[string]string{
		"orders-a-big.csv.pgp":  "failed_terminal/binary_content",
		"orders-b-good.csv.pgp": "archived/",
	}
	for _, f := range testenv.Files(t, pool, "pgpmem") {
		if got := f.State + "/" + f.Reason; got != want[f.Name] {
			t.Fatalf("%s: %s, want %s", f.Name, got, want[f.Name])
		}
	}
	var dataSize int64
	if err := pool.QueryRow(context.Background(), `SELECT data_size FROM file_intake WHERE remote_name = 'orders-a-big.csv.pgp'`).Scan(&dataSize); err != nil || dataSize != 512<<20 {
		t.Fatalf("data_size %d (%v), want the whole plaintext of 512 MiB", dataSize, err)
	}
	testenv.AssertExactOrders(t, pool, "pgpmem", 50, "G")
	t.Logf("peak RSS of intake run: %d MiB", peak>>10)
	if peak > memLimitKiB {
		t.Fatalf("peak RSS %d KiB, want at most %d KiB", peak, memLimitKiB)
	}
	p.signal(syscall.SIGTERM)
	if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("intake run exited %v", ws)
	}
}

// `intake check` reads a PGP feed's key files and unlocks the secret key:
// a wrong passphrase fails the check naming the file, the right one passes.
func TestCheckReadsAndUnlocksPGPKeys(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "pgpcheck")
	us, err := openpgp.NewEntity("intake", "", "intake@example.test", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	if err := us.EncryptPrivateKeys([]byte("right"), nil); err != nil {
		t.Fatal(err)
	}
	var sec bytes.Buffer
	if err := us.SerializePrivateWithoutSigning(&sec, nil); err != nil {
		t.Fatal(err)
	}
	secFile := filepath.Join(t.TempDir(), "intake.key")
	os.WriteFile(secFile, sec.Bytes(), 0o600)
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	raw, _ := os.ReadFile(cfg)
	yaml := strings.Replace(string(raw), "        target: orders\n",
		"        target: orders\n        pgp:\n          private_key_file: "+secFile+"\n          passphrase_env: INTAKE_TEST_PGP_PASS\n", 1)
	if yaml == string(raw) {
		t.Fatal("config template changed: no pgp block added")
	}
	os.WriteFile(cfg, []byte(yaml), 0o600)

	t.Setenv("INTAKE_TEST_PGP_PASS", "wrong")
	code, out := runCLI("check", "--config", cfg)
	if code != 1 || !strings.Contains(out, "FAIL partner pgpcheck pgp keys:") || !strings.Contains(out, "intake.key") || !strings.Contains(out, "cannot be unlocked") {
		t.Fatalf("check with a wrong passphrase exited %d:\n%s", code, out)
	}
	t.Setenv("INTAKE_TEST_PGP_PASS", "right")
	code, out = runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "ok   partner pgpcheck pgp keys") {
		t.Fatalf("check with the right passphrase exited %d:\n%s", code, out)
	}
}
