package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"

	"github.com/partner-intake/partner-intake/internal/syspkg"
)

// pgp measures a signed and encrypted file (OpenPGP, the orders CSV of
// PGPBytes bytes, not compressed) into a feed with `pgp:` and
// require_signature: `intake run --once` from exec to exit, and its peak
// RSS, beside the floor: `gpg --decrypt` of the same file (the signature
// checked) piped into psql's \copy into an empty indexed table, in one
// transaction.
func (e *featureRuns) pgp(ctx context.Context, res *Results) error {
	// the floor's gpg: installed when missing (as root), as the tests'
	// servers are
	if _, err := syspkg.Find([]string{"/usr/bin/gpg"}, "gnupg"); err != nil {
		return fmt.Errorf("the pgp workload's floor needs gpg: %w", err)
	}
	url, root, err := e.databaseAndSite(ctx, "pgp")
	if err != nil {
		return err
	}
	keys := filepath.Join(e.dir, "pgp")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return err
	}
	ours, partner, err := pgpKeys(keys)
	if err != nil {
		return err
	}
	feed := fmt.Sprintf("        pgp: {private_key_file: %q, verify_keys_file: %q, require_signature: true}\n",
		filepath.Join(keys, "intake.asc"), filepath.Join(keys, "partner.gpg"))
	cfg, err := e.configFeed("bench-pgp", "pgp", root, feed, "")
	if err != nil {
		return err
	}
	src := filepath.Join(e.dir, "orders-pgp.csv.gpg")
	rows, size, err := writePGP(src, e.o.PGPBytes, ours, partner)
	if err != nil {
		return err
	}
	defer os.Remove(src)
	res.PGPBytes, res.PGPRows = size, rows
	e.say("pgp: %d rows, %.1f MB signed and encrypted", rows, float64(size)/1e6)

	gnupg := filepath.Join(e.dir, "gnupg")
	if err := os.MkdirAll(gnupg, 0o700); err != nil {
		return err
	}
	defer exec.Command("gpgconf", "--homedir", gnupg, "--kill", "gpg-agent").Run()
	imp := exec.Command("gpg", "--homedir", gnupg, "--batch", "--quiet", "--import", filepath.Join(keys, "intake.asc"), filepath.Join(keys, "partner.gpg"))
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("gpg --import: %v\n%s", err, out)
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	var floorCPU, cpu float64
	floorPG, _, err := e.serverCPUOver(func() (err error) {
		res.PGPFloorS, floorCPU, err = e.floorPGP(url, gnupg, src)
		return err
	})
	if err != nil {
		return err
	}
	res.PGPFloorCPUS = map[string]float64{"gpg_psql": floorCPU, "postgres": floorPG}
	if err := copyFile(src, filepath.Join(root, "ready", "orders-pgp.csv")); err != nil {
		return err
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	pg, sshd, err := e.serverCPUOver(func() (err error) {
		res.PGPS, res.PGPPeakRSSMiB, cpu, err = e.runOnce(url, cfg)
		return err
	})
	if err != nil {
		return err
	}
	res.PGPCPUS = map[string]float64{"intake": cpu, "postgres": pg, "sshd": sshd}
	e.say("pgp: CPU s, intake's run %v, the floor's %v", res.PGPCPUS, res.PGPFloorCPUS)
	ok, err := e.count(ctx, url, `SELECT count(*) FROM file_intake WHERE remote_name = 'orders-pgp.csv' AND state = 'archived' AND rows_applied = $1`, rows)
	if err != nil {
		return err
	}
	floor, err := e.count(ctx, url, `SELECT count(*) FROM floor_orders`)
	if err != nil {
		return err
	}
	if ok != 1 || floor != int64(rows) {
		return fmt.Errorf("check failed: the file is not archived with %d rows applied, or the floor loaded %d rows", rows, floor)
	}
	res.PGPRatioFloor = res.PGPS / res.PGPFloorS
	return nil
}

// floorPGP is `gpg --decrypt FILE | psql` with \copy from psql's stdin
// into the emptied floor table, in one transaction: what a script does
// with the same file on local disk, without download, hash or validation.
// It returns the wall time and the CPU time of gpg and psql (the shell's
// children, which it waited for).
func (e *baselines) floorPGP(url, gnupg, src string) (wall, cpu float64, err error) {
	sf := filepath.Join(e.dir, "floor-pgp.sql")
	script := `\set ON_ERROR_STOP on
BEGIN;
TRUNCATE floor_orders;
\copy floor_orders (order_id, email, amount, status, placed_at, note, qty) FROM pstdin WITH (FORMAT csv, HEADER true)
COMMIT;
`
	if err := os.WriteFile(sf, []byte(script), 0o600); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	cmd := exec.Command("bash", "-o", "pipefail", "-c", `gpg --homedir "$1" --batch --quiet --decrypt "$2" | psql "$3" -q -f "$4"`,
		"floor", gnupg, src, url, sf)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("gpg --decrypt | psql: %v\n%s", err, out)
	}
	wall = time.Since(start).Seconds()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu = rusageCPU(ru)
	}
	return wall, cpu, nil
}

// pgpKeys makes intake's key (secret, no passphrase: intake.asc) and the
// partner's signing key (public: partner.gpg) in dir.
func pgpKeys(dir string) (ours, partner *openpgp.Entity, err error) {
	cfg := &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA}
	if ours, err = openpgp.NewEntity("intake", "", "intake@example.test", cfg); err != nil {
		return
	}
	if partner, err = openpgp.NewEntity("partner", "", "partner@example.test", cfg); err != nil {
		return
	}
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err != nil {
		return
	}
	if err = ours.SerializePrivate(w, nil); err != nil {
		return
	}
	if err = w.Close(); err != nil {
		return
	}
	if err = os.WriteFile(filepath.Join(dir, "intake.asc"), b.Bytes(), 0o600); err != nil {
		return
	}
	b.Reset()
	if err = partner.Serialize(&b); err != nil {
		return
	}
	err = os.WriteFile(filepath.Join(dir, "partner.gpg"), b.Bytes(), 0o600)
	return
}

// writePGP writes orders rows until the plaintext reaches size bytes,
// encrypted to `to` and signed by signer (binary, not compressed), and
// returns the rows and the file's size.
func writePGP(path string, size int64, to, signer *openpgp.Entity) (rows int, n int64, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fw := bufio.NewWriterSize(f, 1<<20)
	enc, err := openpgp.Encrypt(fw, []*openpgp.Entity{to}, signer, &openpgp.FileHints{IsBinary: true}, nil)
	if err != nil {
		return 0, 0, err
	}
	w := bufio.NewWriterSize(enc, 1<<20)
	w.WriteString(csvHeader)
	written := int64(len(csvHeader))
	var line []byte
	for written < size {
		line = orderRow(line[:0], rows, rows, variant{})
		w.Write(line)
		written += int64(len(line))
		rows++
	}
	if err = w.Flush(); err != nil {
		return
	}
	if err = enc.Close(); err != nil {
		return
	}
	if err = fw.Flush(); err != nil {
		return
	}
	st, err := f.Stat()
	if err != nil {
		return
	}
	return rows, st.Size(), f.Close()
}
