package intake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

var pgpTestConfig = &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA}

func pgpEntity(t *testing.T, name string) *openpgp.Entity {
	t.Helper()
	e, err := openpgp.NewEntity(name, "", name+"@example.test", pgpTestConfig)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// writeSecret writes e's secret keys, locked with pass, armored.
func writeSecret(t *testing.T, file string, e *openpgp.Entity, pass string) {
	t.Helper()
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	w.Close()
	// lock a copy: e stays usable by the test
	locked, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if err := locked[0].EncryptPrivateKeys([]byte(pass), nil); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	w, _ = armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err := locked[0].SerializePrivateWithoutSigning(w, nil); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writePublic writes e's public key, binary.
func writePublic(t *testing.T, file string, e *openpgp.Entity) {
	t.Helper()
	var b bytes.Buffer
	if err := e.Serialize(&b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pgpMessage encrypts data to `to`, signed by signer if not nil,
// compressed with zlib.
func pgpMessage(t *testing.T, data []byte, to, signer *openpgp.Entity, armored bool) []byte {
	t.Helper()
	var b bytes.Buffer
	var out interface {
		Write([]byte) (int, error)
		Close() error
	} = nopCloser{&b}
	if armored {
		w, err := armor.Encode(&b, "PGP MESSAGE", nil)
		if err != nil {
			t.Fatal(err)
		}
		out = w
	}
	cfg := &packet.Config{DefaultCompressionAlgo: packet.CompressionZLIB, CompressionConfig: &packet.CompressionConfig{Level: 9}}
	w, err := openpgp.Encrypt(out, []*openpgp.Entity{to}, signer, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out.Close()
	return b.Bytes()
}

type nopCloser struct{ *bytes.Buffer }

func (nopCloser) Close() error { return nil }

// PGP files made here with go-crypto, through the daemon on real
// PostgreSQL and OpenSSH: the good ones (binary and armored) are applied,
// the archive keeps the ciphertext while the ledger records both hashes,
// the same plaintext encrypted again is a duplicate of its batch (the
// batch is the plaintext's); every hostile one is held with its reason,
// nothing of it applied, its plaintext not left in the spool. A rotated
// secret key is picked up without a restart.
func TestPGPFiles(t *testing.T) {
	_, pool := testenv.DB(t)
	dir := t.TempDir()
	t.Setenv("INTAKE_TEST_PGP_PASS", "correct horse")
	us, partner, stranger, other := pgpEntity(t, "intake"), pgpEntity(t, "partner"), pgpEntity(t, "stranger"), pgpEntity(t, "other")
	secretFile, verifyFile := filepath.Join(dir, "intake.asc"), filepath.Join(dir, "partner.pub")
	writeSecret(t, secretFile, us, "correct horse")
	writePublic(t, verifyFile, partner)

	site := testenv.NewSite(t, "pgp")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv\.(pgp|gpg|asc)`
	site.Config.Feeds[0].PGP = &partners.PGP{PrivateKeyFile: secretFile, PassphraseEnv: "INTAKE_TEST_PGP_PASS",
		VerifyKeysFile: verifyFile, RequireSignature: true}
	site.Config.Limits.MaxExpandedBytes = 1 << 20

	good := []byte(testenv.OrdersCSV("P", 5))
	goodMsg := pgpMessage(t, good, us, partner, false)
	bomb := make([]byte, 50<<20) // zlib inside OpenPGP: about 50 KiB
	var signedOnly bytes.Buffer
	sw, err := openpgp.Sign(&signedOnly, partner, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sw.Write(good)
	sw.Close()
	// session-key packets (symmetric, 6 bytes each) ahead of a good
	// message: 600, past the 512 a message to many recipients may need
	flood := bytes.Repeat([]byte{0xc3, 0x04, 0x04, 0x09, 0x00, 0x08}, 600)
	flood = append(flood, pgpMessage(t, []byte(testenv.OrdersCSV("F", 2)), us, partner, false)...)
	// an armor header line of 70 KiB
	armored := pgpMessage(t, []byte(testenv.OrdersCSV("K", 2)), us, partner, true)
	i := bytes.IndexByte(armored, '\n') + 1
	longHeader := append(append(append([]byte(nil), armored[:i]...), "Comment: "+strings.Repeat("A", 70<<10)+"\n"...), armored[i:]...)
	cases := map[string]struct {
		data   []byte
		reason string
	}{
		"orders-keyflood.csv.pgp":   {flood, "pgp_corrupt"},
		"orders-longheader.csv.asc": {longHeader, "pgp_corrupt"},
		"orders-good.csv.pgp":       {goodMsg, ""},
		"orders-armored.csv.asc":    {pgpMessage(t, []byte(testenv.OrdersCSV("A", 3)), us, partner, true), ""},
		"orders-good.csv.gpg":       {pgpMessage(t, good, us, partner, false), "duplicate"},
		"orders-wrongsig.csv.pgp":   {pgpMessage(t, []byte(testenv.OrdersCSV("W", 2)), us, stranger, false), "pgp_bad_signature"},
		"orders-unsigned.csv.pgp":   {pgpMessage(t, []byte(testenv.OrdersCSV("U", 2)), us, nil, false), "pgp_unsigned"},
		"orders-otherkey.csv.pgp":   {pgpMessage(t, []byte(testenv.OrdersCSV("O", 2)), other, partner, false), "pgp_no_key"},
		"orders-truncated.csv.pgp":  {goodMsg[:len(goodMsg)*2/3], "pgp_corrupt"},
		"orders-notpgp.csv.pgp":     {[]byte(testenv.OrdersCSV("N", 2)), "pgp_corrupt"},
		"orders-bomb.csv.pgp":       {pgpMessage(t, bomb, us, partner, false), "archive_too_large"},
		"orders-signonly.csv.pgp":   {signedOnly.Bytes(), "pgp_not_encrypted"},
	}
	for name, c := range cases {
		site.Drop(t, name, string(c.data))
	}

	r := newRig(t, pool, "w1", site)
	r.poll("pgp")

	got := files(t, pool, "pgp")
	if len(got) != len(cases) {
		t.Fatalf("%d files processed, want %d", len(got), len(cases))
	}
	var dups, goods int
	for _, f := range got {
		c := cases[f.Name]
		if f.Batch == "orders-good" { // two ciphertexts of one plaintext: one applied, one duplicate
			switch f.State {
			case "archived":
				goods++
			case "duplicate":
				dups++
			default:
				t.Fatalf("%s: %+v", f.Name, f)
			}
			continue
		}
		if c.reason == "" {
			if f.State != "archived" || f.Applied == 0 {
				t.Fatalf("%s: %+v, want archived", f.Name, f)
			}
			continue
		}
		if f.State != "quarantined" || f.Reason != c.reason || f.Total != 0 {
			t.Fatalf("%s: %+v, want quarantined %s, unparsed", f.Name, f, c.reason)
		}
		if rc := receipt(t, site, f.Receipt); string(rc.Reason) != c.reason {
			t.Fatalf("%s: receipt %+v", f.Name, rc)
		}
	}
	if goods != 1 || dups != 1 {
		t.Fatalf("batch orders-good: %d archived, %d duplicate; want 1 and 1", goods, dups)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgp'`); n != 8 {
		t.Fatalf("%d rows, want the 5 + 3 rows of the good files", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgp' AND order_id NOT LIKE 'P-%' AND order_id NOT LIKE 'A-%'`); n != 0 {
		t.Fatalf("%d rows of held files applied", n)
	}

	// the ledger records the ciphertext's hash and the plaintext's; the
	// archive keeps the ciphertext
	var content, data string
	if err := pool.QueryRow(context.Background(), `SELECT content_sha256, data_sha256 FROM file_intake WHERE partner_id = 'pgp' AND remote_name = 'orders-good.csv.pgp'`).Scan(&content, &data); err != nil {
		t.Fatal(err)
	}
	if content != sha(string(goodMsg)) || data != sha(string(good)) {
		t.Fatalf("hashes %s / %s, want the ciphertext's %s and the plaintext's %s", content, data, sha(string(goodMsg)), sha(string(good)))
	}
	for _, f := range got {
		if f.Name == "orders-good.csv.pgp" && f.State == "archived" {
			rel, _ := filepath.Rel(site.Root, f.Archive)
			if site.Read(t, rel) != string(goodMsg) {
				t.Fatal("the archive does not hold the ciphertext")
			}
		}
	}
	// no plaintext is left in the spool: a held file's is removed when it
	// is held, an applied file's when it is finished (the P plaintext,
	// read by two intakes finishing at once, may stay until purge: each may
	// see the other unfinished, as for two compressed files of one content)
	var spooled []string
	filepath.WalkDir(filepath.Join(r.spoolDir, "pgp", "sha256"), func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			spooled = append(spooled, e.Name())
		}
		return nil
	})
	for _, prefix := range []string{"A", "W", "U"} {
		n := map[string]int{"P": 5, "A": 3}[prefix]
		if n == 0 {
			n = 2
		}
		if plain := sha(testenv.OrdersCSV(prefix, n)); slices.Contains(spooled, plain) {
			t.Fatalf("the spool holds the plaintext of the %s file: %v", prefix, spooled)
		}
	}
	if !slices.Contains(spooled, sha(string(goodMsg))) {
		t.Fatalf("the spool does not hold the ciphertext: %v", spooled)
	}

	// a replay decrypts the archived ciphertext again (its plaintext left
	// the spool when it finished) and finds every row unchanged
	var armoredID int64
	for _, f := range got {
		if f.Name == "orders-armored.csv.asc" {
			armoredID = f.ID
		}
	}
	in, err := r.d.Replay(context.Background(), intake.ReplayRequest{ID: armoredID, Actor: "test", Reason: "re-apply"})
	if err != nil {
		t.Fatalf("replay of a PGP file: %v", err)
	}
	var state string
	var unchanged int64
	if err := pool.QueryRow(context.Background(), `SELECT state, rows_unchanged FROM file_intake WHERE intake_id = $1`, in.ID).Scan(&state, &unchanged); err != nil || state != "archived" || unchanged != 3 {
		t.Fatalf("replay: %s, %d unchanged (%v)", state, unchanged, err)
	}

	// a rotated secret key is read again when its file changes
	next := pgpEntity(t, "intake-2025")
	writeSecret(t, secretFile, next, "correct horse")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(secretFile, later, later); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-rotated.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("R", 2)), next, partner, false)))
	r.poll("pgp")
	rotated := false
	for _, f := range files(t, pool, "pgp") {
		if f.Name == "orders-rotated.csv.pgp" {
			if rotated = true; f.State != "archived" || f.Applied != 2 {
				t.Fatalf("after the key rotation: %+v", f)
			}
		}
	}
	if !rotated {
		t.Fatal("the file encrypted to the rotated key was not taken")
	}
}

// readSealed decrypts an armored report with the partner's key and checks
// it is signed by intake's key.
func readSealed(t *testing.T, data string, partner, us *openpgp.Entity) []byte {
	t.Helper()
	blk, err := armor.Decode(strings.NewReader(data))
	if err != nil {
		t.Fatalf("report not armored OpenPGP: %v", err)
	}
	md, err := openpgp.ReadMessage(blk.Body, openpgp.EntityList{partner, us}, nil, nil)
	if err != nil {
		t.Fatalf("report not decryptable with the partner's key: %v", err)
	}
	plain, err := io.ReadAll(md.UnverifiedBody)
	if err != nil {
		t.Fatal(err)
	}
	if !md.IsSigned || md.SignedBy == nil || md.SignedBy.Entity.PrimaryKey.KeyId != us.PrimaryKey.KeyId || md.SignatureError != nil {
		t.Fatalf("report not signed by intake's key: signed %v, error %v", md.IsSigned, md.SignatureError)
	}
	return plain
}

// With encrypt_reports_to, the receipt and the rejects report are written
// encrypted to the partner's key and signed by intake's, named .asc; the
// partner decrypts them to the usual JSON and CSV. A held file's receipt
// is sealed too.
func TestPGPReportsAreEncryptedToThePartner(t *testing.T) {
	_, pool := testenv.DB(t)
	dir := t.TempDir()
	us, partner := pgpEntity(t, "intake"), pgpEntity(t, "partner")
	secretFile, partnerFile := filepath.Join(dir, "intake.asc"), filepath.Join(dir, "partner.pub")
	writeSecret(t, secretFile, us, "")
	writePublic(t, partnerFile, partner)
	site := testenv.NewSite(t, "pgprep")
	site.Config.Feeds[0].Pattern = `orders-.*\.csv\.pgp`
	site.Config.Feeds[0].PGP = &partners.PGP{PrivateKeyFile: secretFile, VerifyKeysFile: partnerFile, RequireSignature: true, EncryptReportsTo: partnerFile}
	content := testenv.OrdersCSV("E", 3) + "E-x,not-an-email,10.00,paid,2026-11-01T10:00:00Z,1\n"
	site.Drop(t, "orders-rej.csv.pgp", string(pgpMessage(t, []byte(content), us, partner, false)))
	site.Drop(t, "orders-unsigned.csv.pgp", string(pgpMessage(t, []byte(content), us, nil, false)))
	r := newRig(t, pool, "w1", site)
	r.poll("pgprep")

	got := files(t, pool, "pgprep")
	if len(got) != 2 {
		t.Fatalf("%d files, want 2", len(got))
	}
	for _, f := range got {
		if !strings.HasSuffix(f.Receipt, sitefile.ReceiptSuffix+sitefile.EncryptedSuffix) {
			t.Fatalf("%s: receipt %q not sealed", f.Name, f.Receipt)
		}
		rel, _ := filepath.Rel(site.Root, f.Receipt)
		var rc sitefile.Receipt
		if err := json.Unmarshal(readSealed(t, site.Read(t, rel), partner, us), &rc); err != nil {
			t.Fatal(err)
		}
		switch f.Name {
		case "orders-rej.csv.pgp":
			if f.State != "archived" || rc.Rows.Applied != 3 || rc.Rows.Rejected != 1 || rc.IntakeID != f.ID {
				t.Fatalf("%+v: receipt %+v", f, rc)
			}
			if !strings.HasSuffix(f.Rejects, sitefile.RejectsSuffix+sitefile.EncryptedSuffix) || rc.Rejects != f.Rejects {
				t.Fatalf("rejects report %q, receipt names %q", f.Rejects, rc.Rejects)
			}
			rel, _ := filepath.Rel(site.Root, f.Rejects)
			rej := string(readSealed(t, site.Read(t, rel), partner, us))
			if !strings.HasPrefix(rej, "line,column,reason") || !strings.Contains(rej, "\n5,email,") {
				t.Fatalf("rejects report:\n%s", rej)
			}
		case "orders-unsigned.csv.pgp":
			if string(rc.Reason) != "pgp_unsigned" {
				t.Fatalf("held file's receipt %+v", rc)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgprep'`); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}

	// ops discard the held file: its rewritten receipt is sealed too
	var held int64
	for _, f := range got {
		if f.Name == "orders-unsigned.csv.pgp" {
			held = f.ID
		}
	}
	ctx := context.Background()
	if err := ops.Discard(ctx, pool, ops.Decision{IntakeID: held, Actor: "carol", Reason: "unsigned", Partners: []string{"pgprep"},
		Worker: intake.OpsWorker("w1")}); err != nil {
		t.Fatal(err)
	}
	if err := ops.PublishDecision(ctx, pool, []partners.Config{site.Validated(t)}, held); err != nil {
		t.Fatal(err)
	}
	discarded := false
	for _, f := range files(t, pool, "pgprep") {
		if f.ID != held {
			continue
		}
		discarded = true
		if f.State != "discarded" || !strings.HasSuffix(f.Receipt, sitefile.ReceiptSuffix+sitefile.EncryptedSuffix) {
			t.Fatalf("discarded file: %+v", f)
		}
		rel, _ := filepath.Rel(site.Root, f.Receipt)
		var rc sitefile.Receipt
		if err := json.Unmarshal(readSealed(t, site.Read(t, rel), partner, us), &rc); err != nil {
			t.Fatal(err)
		}
		if rc.Outcome != ledger.OutcomeDiscarded {
			t.Fatalf("discard receipt %+v", rc)
		}
	}
	if !discarded {
		t.Fatal("the held file is gone from the ledger")
	}
}

// A daemon does not start with a PGP key it cannot use (a missing file, a
// wrong passphrase), and the error names the file, not the key.
func TestPGPKeysThatCannotBeUsedStopTheStart(t *testing.T) {
	_, pool := testenv.DB(t)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "intake.asc")
	writeSecret(t, secretFile, pgpEntity(t, "intake"), "right")
	t.Setenv("INTAKE_TEST_PGP_WRONG", "wrong")
	for _, c := range []struct {
		file, env, want string
	}{
		{filepath.Join(dir, "missing.asc"), "", "missing.asc"},
		{secretFile, "INTAKE_TEST_PGP_WRONG", "cannot be unlocked"},
	} {
		site := testenv.NewSite(t, "pgpkeys")
		site.Config.Feeds[0].PGP = &partners.PGP{PrivateKeyFile: c.file, PassphraseEnv: c.env}
		sp, err := spool.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		_, err = intake.New(intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1}, []partners.Config{site.Validated(t)}, pool, sp,
			prometheus.NewRegistry(), testenv.Logger(t))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Fatalf("%s: New: %v, want an error naming %q", c.file, err, c.want)
		}
	}
}

// pgpSite is a site whose feed takes orders-*.csv.pgp files in chunks of
// chunkRows: OpenPGP messages encrypted to us and signed by partner (a
// signature required).
func pgpSite(t *testing.T, id string, chunkRows int) (site *testenv.Site, us, partner *openpgp.Entity) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("INTAKE_TEST_PGP_PASS", "correct horse")
	us, partner = pgpEntity(t, "intake"), pgpEntity(t, "partner")
	secretFile, verifyFile := filepath.Join(dir, "intake.asc"), filepath.Join(dir, "partner.pub")
	writeSecret(t, secretFile, us, "correct horse")
	writePublic(t, verifyFile, partner)
	site = testenv.NewSite(t, id)
	site.Config.Feeds[0].Pattern = `orders-.*\.csv\.pgp`
	site.Config.Feeds[0].ChunkRows = chunkRows
	site.Config.Feeds[0].PGP = &partners.PGP{PrivateKeyFile: secretFile, PassphraseEnv: "INTAKE_TEST_PGP_PASS",
		VerifyKeysFile: verifyFile, RequireSignature: true}
	return site, us, partner
}

// A large encrypted file's rows are applied ahead of its plan while it
// decrypts into the spool (followRows), as a plain file's while it
// downloads; one whose signature turns out not to be the partner's,
// which is known only at the end of the decryption, applies nothing: what
// it applied ahead rolls back with the hold.
func TestALargePGPFileIsAppliedWhileItDecrypts(t *testing.T) {
	defer intake.SetAheadBytes(64 << 10)()
	_, pool := testenv.DB(t)
	site, us, partner := pgpSite(t, "pgpa", 500)
	stranger := pgpEntity(t, "stranger")
	for _, c := range []struct {
		worker string
		name   string
		signer *openpgp.Entity
		prefix string
		state  string
	}{
		{"w1", "orders-big.csv.pgp", partner, "B", "archived"},
		{"w2", "orders-forged.csv.pgp", stranger, "G", "quarantined"},
	} {
		// a daemon each: an apply ahead's slot is let go once its
		// goroutine ends, which the next file's download may not wait for
		r := newRig(t, pool, c.worker, site)
		ahead := &intake.Signals(r.d).AheadChunk
		ahead.Init(t)
		site.Drop(t, c.name, string(pgpMessage(t, []byte(testenv.OrdersCSV(c.prefix, 5000)), us, c.signer, false)))
		r.poll("pgpa")
		var f fileRow
		for _, g := range files(t, pool, "pgpa") {
			if g.Name == c.name {
				f = g
			}
		}
		if f.State != c.state {
			t.Fatalf("%s: %+v, want %s", c.name, f, c.state)
		}
		want, result := int64(5000), "committed"
		if c.state != "archived" {
			want, result = 0, "rolled_back"
		}
		if n := testutil.ToFloat64(r.d.Metrics().Ahead.WithLabelValues("pgpa", result)); n != 1 {
			t.Fatalf("%s: intake_apply_ahead_total{result=%q} %v, want 1: applied ahead while it decrypted", c.name, result, n)
		}
		if result == "committed" {
			select {
			case <-ahead.C():
			default:
				t.Fatalf("%s: committed ahead without a chunk", c.name)
			}
		}
		if n := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgpa' AND order_id LIKE $1`, c.prefix+"-%"); n != want {
			t.Fatalf("%s: %d of its rows in the target, want %d", c.name, n, want)
		}
	}
}

// A large encrypted file is decrypted as it downloads, not after: with
// its download paused at half the file, chunks of its rows are already
// applied ahead; let go, it lands whole. Decrypted after the download,
// its rows waited for every byte of it, which a far site takes seconds
// to bring, and the 1 GB file on loopback five.
func TestAPGPFileIsDecryptedAndAppliedWhileItDownloads(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	r, pool, n := farPGPFile(t, "pgpd")
	ahead := &intake.Signals(r.d).AheadChunk
	ahead.Init(t)

	resume := r.pollPaused("pgpd", "download:half")
	ahead.WaitFor(func(int) bool { return true }) // while the download waits
	// its plaintext goes to the apply ahead alone: the spool holds the
	// download's bytes and nothing else
	if left := spoolFiles(t, r.spoolDir); len(left) != 1 || !strings.HasSuffix(left[0], spool.TempSuffix) {
		t.Fatalf("the spool holds %v while the file decrypts, want the download's temporary file alone", left)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	if fs := files(t, pool, "pgpd"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != n {
		t.Fatalf("%+v, want the file archived with its %d rows", fs, n)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Ahead.WithLabelValues("pgpd", "committed")); got != 1 {
		t.Fatalf("intake_apply_ahead_total{result=\"committed\"} %v, want 1", got)
	}
	// and nothing of the spool stays open (the garbage collector, off,
	// closes none of it)
	if open := openUnder(t, r.spoolDir); len(open) != 0 {
		t.Fatalf("spool files still open after the file was archived: %v", open)
	}
}

// farPGPFile is a partner id whose site counts as far but is read on one
// channel, with one signed and encrypted file in ready/, of n rows, its
// decryption following the download: large enough that half the file is
// more than the spool's write-behind buffers (512 KiB each), which the
// decryption and the rows are read behind; applied ahead.
func farPGPFile(t *testing.T, id string) (r *rig, pool *pgxpool.Pool, n int64) {
	t.Helper()
	t.Cleanup(intake.SetAheadBytes(64 << 10))
	t.Cleanup(intake.SetTwoChannels(1<<62, 0))
	_, pool = testenv.DB(t)
	site, us, partner := pgpSite(t, id, 5000)
	n = 100000
	site.Drop(t, "orders-"+id+".csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("F", int(n))), us, partner, false)))
	return newRig(t, pool, "w1", site), pool, n
}

// openUnder lists the files under dir this process has open.
func openUnder(t *testing.T, dir string) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, fd := range fds {
		if p, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	return out
}

// spoolFiles lists the regular files under the spool dir.
func spoolFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// A large encrypted file applied ahead keeps no plaintext in the spool;
// a step that reads the file from the spool after all has the plaintext
// made again from the spooled original, in the same run: an apply ahead
// that gives way (rows whose keys a file before it brought), and a plan
// with more rejected rows than it holds in memory (streamed from the
// spool into the ledger).
func TestAPGPFileReadAgainIsDecryptedAgain(t *testing.T) {
	// larger than the window and the write-behind buffers before it
	// (about 1.8 MB): the decryption waits on the apply ahead
	const n = 60000
	all := testenv.OrdersCSV("G", n)
	lines := strings.SplitAfter(all, "\n")
	for _, c := range []struct {
		name               string
		first              string // a file before it, or none
		file               string
		applied, unchanged int64
		rejected           int64
		abandoned          float64
	}{
		// rows 3000-3002 (chunk 6) come first
		{"gives way", lines[0] + strings.Join(lines[3001:3004], ""), all, n - 3, 3, 0, 1},
		// every thousandth row has an email that is none
		{"rejects streamed", "", strings.ReplaceAll(all, "000@example.com", "000-at-example.com"), n - 60, 0, 60, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer intake.SetAheadBytes(64 << 10)()
			defer intake.SetMaxHeldIssues(2)()
			_, pool := testenv.DB(t)
			site, us, partner := pgpSite(t, "pgpg", 500)
			r := newRig(t, pool, "w1", site)
			if c.first != "" {
				site.Drop(t, "orders-first.csv.pgp", string(pgpMessage(t, []byte(c.first), us, partner, false)))
				r.poll("pgpg")
			}
			site.Drop(t, "orders-second.csv.pgp", string(pgpMessage(t, []byte(c.file), us, partner, false)))
			r.poll("pgpg")
			fs := files(t, pool, "pgpg")
			f := fs[len(fs)-1]
			if f.State != "archived" || f.Applied != c.applied || f.Unchanged != c.unchanged || f.Rejected != c.rejected {
				t.Fatalf("%+v, want the file archived: %d applied, %d unchanged, %d rejected", f, c.applied, c.unchanged, c.rejected)
			}
			if got := testutil.ToFloat64(r.d.Metrics().Ahead.WithLabelValues("pgpg", "abandoned")); got != c.abandoned {
				t.Fatalf("intake_apply_ahead_total{result=\"abandoned\"} %v, want %v", got, c.abandoned)
			}
			if got := count(t, pool, `SELECT count(*) FROM intake_row_issue WHERE intake_id = $1`, f.ID); got != c.rejected {
				t.Fatalf("%d rejected rows in the ledger, want %d", got, c.rejected)
			}
		})
	}
}

// A large file's decryption takes the apply ahead's slot before it starts
// (its plaintext goes to the apply ahead alone) and gives it back when it
// ends before the apply ahead starts: a file not encrypted to intake's
// key leaves the next large file applied ahead.
func TestADecryptionThatEndsEarlyGivesBackItsApplyAheadSlot(t *testing.T) {
	defer intake.SetAheadBytes(64 << 10)()
	_, pool := testenv.DB(t)
	site, us, partner := pgpSite(t, "pgps", 500)
	stranger := pgpEntity(t, "stranger")
	r := newRig(t, poolOf(t, pool, 4), "w1", site) // one slot for an apply ahead (a pool of 4: 4/2-1)
	site.Drop(t, "orders-a.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("A", 5000)), stranger, partner, false)))
	r.poll("pgps")
	site.Drop(t, "orders-b.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("B", 5000)), us, partner, false)))
	r.poll("pgps")
	fs := files(t, pool, "pgps")
	if len(fs) != 2 || fs[0].Reason != string(reason.PGPNoKey) || fs[1].State != "archived" || fs[1].Applied != 5000 {
		t.Fatalf("%+v, want the first held pgp_no_key and the second archived with its 5000 rows", fs)
	}
	if got := testutil.ToFloat64(r.d.Metrics().Ahead.WithLabelValues("pgps", "committed")); got != 1 {
		t.Fatalf("intake_apply_ahead_total{result=\"committed\"} %v, want 1: the second file applied ahead", got)
	}
}

// poolOf is a pool on pool's database of at most max connections.
func poolOf(t *testing.T, pool *pgxpool.Pool, max int32) *pgxpool.Pool {
	t.Helper()
	pc := pool.Config().Copy()
	pc.MaxConns = max
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, p)
	return p
}

// A large encrypted file whose rows stop being readable early (a NUL
// byte: not text) is held for it, though its plaintext, which the apply
// ahead reads alone, goes on for megabytes after the row that stopped
// the apply ahead's reader: the decryption is not left waiting for it.
func TestALargePGPFileWithAnUnreadableRowEarlyIsHeld(t *testing.T) {
	defer intake.SetAheadBytes(64 << 10)()
	_, pool := testenv.DB(t)
	site, us, partner := pgpSite(t, "pgpb", 500)
	r := newRig(t, pool, "w1", site)
	lines := strings.SplitAfter(testenv.OrdersCSV("N", 60000), "\n")
	lines[100] = strings.Replace(lines[100], "@", "\x00@", 1)
	site.Drop(t, "orders-nul.csv.pgp", string(pgpMessage(t, []byte(strings.Join(lines, "")), us, partner, false)))
	r.poll("pgpb")
	fs := files(t, pool, "pgpb")
	if len(fs) != 1 || fs[0].Reason != string(reason.BinaryContent) || fs[0].Applied != 0 {
		t.Fatalf("%+v, want the file held binary_content, nothing applied", fs)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgpb'`); got != 0 {
		t.Fatalf("%d rows in the target, want 0", got)
	}
}

// A download cut short while its apply ahead waits for the feed's
// snapshot lock (an older snapshot of the feed holds it) ends the attempt
// at once: the decryption, which hands its plaintext to that apply ahead
// alone, is not left waiting for the lock. The next attempt, the lock let
// go, applies the file.
func TestAPGPDownloadCutWhileItsApplyAheadWaitsForALockEndsAtOnce(t *testing.T) {
	t.Cleanup(intake.SetAheadBytes(64 << 10))
	t.Cleanup(intake.SetTwoChannels(1<<62, 0))
	_, pool := testenv.DB(t)
	site, us, partner := pgpSite(t, "pgpw", 5000)
	site.Config.Feeds[0].Mode = partners.ModeSnapshot
	site.Config.Feeds[0].DeleteGuard = &partners.DeleteGuard{Off: true}
	const n = 100000
	site.Drop(t, "orders-pgpw.csv.pgp", string(pgpMessage(t, []byte(testenv.OrdersCSV("W", n)), us, partner, false)))
	r := newRig(t, pool, "w1", site)

	ctx := context.Background()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('partner-intake/snapshot/pgpw/'::text || $1::text, 0::int8))`,
		site.Config.Feeds[0].Name); err != nil {
		t.Fatal(err)
	}
	if err := fault.Set("download:half=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	done := make(chan struct{})
	go func() {
		defer close(done)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		r.d.PollOnce(pctx, "pgpw") // the file's attempt fails; the poll goes on
	}()
	select {
	case <-done:
	case <-time.After(45 * time.Second):
		t.Fatal("the attempt waits for the snapshot lock its download no longer needs")
	}
	if fault.Hits("download:half") != 1 {
		t.Fatal("the download was not cut at half")
	}
	lock.Rollback(ctx)

	fault.Set("")
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() WHERE partner_id = 'pgpw'`)
	r.poll("pgpw")
	if fs := files(t, pool, "pgpw"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != n {
		t.Fatalf("the next attempt: %+v, want the file archived with its %d rows", fs, n)
	}
}

// A download cut short while its decryption follows it leaves nothing of
// the decryption behind: no plaintext in the spool, no temporary file, no
// row in the target (what was applied ahead rolled back); the next
// attempt downloads and decrypts the file whole.
func TestAPGPDownloadCutShortLeavesNothingOfItsDecryption(t *testing.T) {
	r, pool, n := farPGPFile(t, "pgpc")

	if err := fault.Set("download:half=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.d.PollOnce(ctx, "pgpc") // the file's attempt fails; the poll goes on
	if fault.Hits("download:half") != 1 {
		t.Fatal("the download was not cut at half")
	}
	if fs := files(t, pool, "pgpc"); len(fs) != 1 || fs[0].State == "archived" || fs[0].Applied != 0 {
		t.Fatalf("after the cut: %+v, want the file waiting for its next attempt", fs)
	}
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'pgpc'`); got != 0 {
		t.Fatalf("%d rows in the target after the cut, want 0", got)
	}
	if left := spoolFiles(t, r.spoolDir); len(left) != 0 {
		t.Fatalf("the cut download left %v in the spool", left)
	}

	fault.Set("")
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() WHERE partner_id = 'pgpc'`) // due now, not after its backoff
	r.poll("pgpc")
	if fs := files(t, pool, "pgpc"); len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != n {
		t.Fatalf("the next attempt: %+v, want the file archived with its %d rows", fs, n)
	}
}
