package unwrap

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"

	"github.com/partner-intake/partner-intake/partners"
)

// cutReader gives n bytes of r, then fails with err.
type cutReader struct {
	r   io.Reader
	n   int
	err error
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		return 0, c.err
	}
	p = p[:min(len(p), c.n)]
	k, err := c.r.Read(p)
	c.n -= k
	return k, err
}

// A read error of the bytes being decrypted (the spool, or the download a
// decryption follows) is the job's error, to be retried, wherever it
// comes: inside an armored message's header lines too, where it was once
// taken for a corrupt file (held pgp_corrupt). The whole message
// decrypts.
func TestAReadErrorWhileDecryptingIsAnErrorNotAHold(t *testing.T) {
	dir := t.TempDir()
	us, err := openpgp.NewEntity("intake", "", "intake@example.test", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	var key bytes.Buffer
	w, _ := armor.Encode(&key, openpgp.PrivateKeyType, nil)
	if err := us.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	w.Close()
	keyFile := filepath.Join(dir, "intake.asc")
	if err := os.WriteFile(keyFile, key.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var msg bytes.Buffer
	aw, _ := armor.Encode(&msg, "PGP MESSAGE", map[string]string{"Comment": "a header line long enough to be cut inside"})
	pw, err := openpgp.Encrypt(aw, []*openpgp.Entity{us}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pw.Write([]byte("order_id,amount\n1,2\n"))
	pw.Close()
	aw.Close()

	job := Job{Feed: &partners.Feed{PGP: &partners.PGP{PrivateKeyFile: keyFile}}, Name: "orders.csv.asc", MaxBytes: 1 << 20}
	lost := errors.New("the download broke")
	for _, cut := range []int{70, 40, msg.Len() / 2} {
		_, held, err := job.RunOn(&cutReader{r: bytes.NewReader(msg.Bytes()), n: cut, err: lost})
		if held != nil || !errors.Is(err, lost) {
			t.Fatalf("cut after %d bytes: held %+v, err %v; want the read's error", cut, held, err)
		}
	}
}
