package unwrap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	pgperrors "github.com/ProtonMail/go-crypto/openpgp/errors"

	"github.com/partner-intake/partner-intake/intake/pgpkeys"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// CheckPGPKeys reads every key file of p's feeds (and unlocks the secret
// keys), so a daemon does not start, nor a reload apply, with a key that
// cannot be used; the error names the file, never key material.
func CheckPGPKeys(p *partners.Config) error {
	for i := range p.Feeds {
		c := p.Feeds[i].PGP
		if c == nil {
			continue
		}
		if _, err := pgpkeys.Load(c.PrivateKeyFile, c.PassphraseEnv); err != nil {
			return fmt.Errorf("partner %s feed %s: %w", p.ID, p.Feeds[i].Name, err)
		}
		for _, f := range []string{c.VerifyKeysFile, c.EncryptReportsTo} {
			if f == "" {
				continue
			}
			if _, err := pgpkeys.Load(f, ""); err != nil {
				return fmt.Errorf("partner %s feed %s: %w", p.ID, p.Feeds[i].Name, err)
			}
		}
	}
	return nil
}

// pgpRing decrypts with intake's secret keys only and verifies
// signatures with the partner's keys only: a file signed by intake's own
// key is not "signed by the partner".
type pgpRing struct{ secret, verify openpgp.EntityList }

func (k pgpRing) KeysById(id uint64) []openpgp.Key { return k.secret.KeysById(id) }
func (k pgpRing) KeysByIdUsage(id uint64, usage byte) []openpgp.Key {
	return k.verify.KeysByIdUsage(id, usage)
}
func (k pgpRing) DecryptionKeys() []openpgp.Key { return k.secret.DecryptionKeys() }

// errReader remembers the first error its reader returned other than EOF:
// an error from decryption, not from the spool's writing.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// pgpHeadBytes bounds the session-key packets before the encrypted data
// (pgpHead), pgpHeadPackets how many there are, armorHeadBytes the
// armor's header lines. go-crypto grows an armor header line by
// copying it, keeps every session-key packet it reads until the
// encrypted data, and tries a private-key operation for each one naming
// intake's key (its id is public): a file of them alone would otherwise
// hold memory and CPU in step with its size. A message to a hundred
// recipients with RSA-8192 keys needs about 100 KiB.
const (
	pgpHeadBytes   = 1 << 20
	pgpHeadPackets = 512
	armorHeadBytes = 64 << 10 // the armor's header lines: a Version and a Comment or two
)

// pgpHead reads the packets that open an OpenPGP message before its
// encrypted data (public-key and symmetric-key encrypted session keys,
// markers), within pgpHeadPackets and pgpHeadBytes, and returns a reader
// of the whole message again. It stops at the first other packet, unread
// past its first byte; what it cannot frame it leaves to ReadMessage to
// refuse.
func pgpHead(src io.Reader) (io.Reader, error) {
	var seen bytes.Buffer
	t := io.TeeReader(src, &seen)
	again := func() io.Reader { return io.MultiReader(&seen, src) }
	for n := 0; ; n++ {
		var b [1]byte
		if _, err := io.ReadFull(t, b[:]); err != nil || b[0]&0x80 == 0 {
			return again(), nil
		}
		var tag byte
		var size int64
		if b[0]&0x40 != 0 { // new format
			tag = b[0] & 0x3f
			if tag == 1 || tag == 3 || tag == 10 {
				var err error
				if size, err = newLength(t); err != nil {
					return again(), nil
				}
			}
		} else { // old format
			tag = (b[0] >> 2) & 0x0f
			if tag == 1 || tag == 3 || tag == 10 {
				k := [4]int{1, 2, 4, 0}[b[0]&3]
				if k == 0 {
					return again(), nil // indeterminate: not for these packets
				}
				var l [4]byte
				if _, err := io.ReadFull(t, l[:k]); err != nil {
					return again(), nil
				}
				for _, c := range l[:k] {
					size = size<<8 | int64(c)
				}
			}
		}
		if tag != 1 && tag != 3 && tag != 10 {
			return again(), nil // the encrypted data (or what ReadMessage refuses)
		}
		if n >= pgpHeadPackets {
			return nil, fmt.Errorf("more than %d session-key packets before the encrypted data", pgpHeadPackets)
		}
		if int64(seen.Len())+size > pgpHeadBytes {
			return nil, fmt.Errorf("more than %d bytes of session-key packets before the encrypted data", pgpHeadBytes)
		}
		if _, err := io.CopyN(io.Discard, t, size); err != nil {
			return again(), nil
		}
	}
}

// newLength reads a new-format packet's length; a partial length (only
// data packets may have one) is an error here.
func newLength(r io.Reader) (int64, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return 0, err
	}
	switch o := int64(b[0]); {
	case o < 192:
		return o, nil
	case o < 224:
		if _, err := io.ReadFull(r, b[1:2]); err != nil {
			return 0, err
		}
		return (o-192)<<8 + int64(b[1]) + 192, nil
	case o == 255:
		if _, err := io.ReadFull(r, b[:4]); err != nil {
			return 0, err
		}
		return int64(b[0])<<24 | int64(b[1])<<16 | int64(b[2])<<8 | int64(b[3]), nil
	}
	return 0, errors.New("pgp: a partial length on a session-key packet")
}

// headBudget reads at most left bytes until it is lifted (once the
// armor's header lines are read), then all; over says the budget ran
// out.
type headBudget struct {
	r    io.Reader
	left int64
	on   bool // lifted
	over bool
}

func (h *headBudget) Read(p []byte) (int, error) {
	if !h.on {
		if h.left <= 0 {
			h.over = true
			return 0, errPGPHead
		}
		p = p[:min(int64(len(p)), h.left)]
	}
	n, err := h.r.Read(p)
	h.left -= int64(n)
	return n, err
}

func (h *headBudget) lift() { h.on = true }

var errPGPHead = errors.New("pgp: too much before the encrypted data")

// decrypt streams the spooled ciphertext orig through OpenPGP into the
// spool, the plaintext under its own hash, capped at MaxBytes while
// streaming (OpenPGP's own compression included: a bomb stops at the
// cap). The signature is only known once the whole plaintext has been
// read, so the plaintext is returned (for plan and apply) only after it
// checks out; a held file's plaintext leaves the spool again.
func (j Job) decrypt(f io.Reader) (spool.Entry, *Held, error) {
	cfg, max := j.Feed.PGP, j.MaxBytes
	secret, err := pgpkeys.Load(cfg.PrivateKeyFile, cfg.PassphraseEnv)
	if err != nil {
		return spool.Entry{}, nil, err
	}
	var verify openpgp.EntityList
	if cfg.VerifyKeysFile != "" {
		if verify, err = pgpkeys.Load(cfg.VerifyKeysFile, ""); err != nil {
			return spool.Entry{}, nil, err
		}
	}
	disk := &errReader{r: f} // the spool's own read errors are not the partner's
	head := &headBudget{r: disk, left: armorHeadBytes}
	in := bufio.NewReader(head)
	var src io.Reader = in
	if peek, _ := in.Peek(64); bytes.Contains(peek, []byte("-----BEGIN PGP")) {
		blk, err := armor.Decode(in) // reads the header lines; the body as it is read
		switch {
		case disk.err != nil:
			return spool.Entry{}, nil, fmt.Errorf("decrypt: read the spooled file: %w", disk.err)
		case head.over:
			return spool.Entry{}, &Held{reason.PGPCorrupt, fmt.Sprintf("the armor's header lines take more than %d bytes", armorHeadBytes)}, nil
		case err != nil:
			return spool.Entry{}, &Held{reason.PGPCorrupt, "the armored data cannot be read"}, nil
		}
		src = blk.Body
	}
	head.lift()
	src, err = pgpHead(src)
	if err != nil {
		if disk.err != nil {
			return spool.Entry{}, nil, fmt.Errorf("decrypt: read the spooled file: %w", disk.err)
		}
		return spool.Entry{}, &Held{reason.PGPCorrupt, err.Error()}, nil
	}
	md, err := openpgp.ReadMessage(src, pgpRing{secret, verify}, nil, nil)
	switch {
	case disk.err != nil:
		return spool.Entry{}, nil, fmt.Errorf("decrypt: read the spooled file: %w", disk.err)
	case errors.Is(err, pgperrors.ErrKeyIncorrect):
		return spool.Entry{}, &Held{reason.PGPNoKey, "the file is not encrypted to intake's key"}, nil
	case err != nil:
		return spool.Entry{}, &Held{reason.PGPCorrupt, "the file is not a readable OpenPGP message"}, nil
	case !md.IsEncrypted || md.IsSymmetricallyEncrypted:
		return spool.Entry{}, &Held{reason.PGPNotEncrypted, "the OpenPGP message is not encrypted to intake's key"}, nil
	}
	body := &errReader{r: md.UnverifiedBody}
	e, nested, err := j.putWatched(max, 0, body) // the spool's free space, no ratio
	switch {
	case errors.Is(err, spool.ErrTooLarge):
		return e, &Held{reason.ArchiveTooLarge, fmt.Sprintf("it decrypts to more than %d bytes", max)}, nil
	case errors.Is(err, errSpoolLow):
		return e, nil, err // the disk's, not the file's: retried later
	case disk.err != nil:
		return e, nil, fmt.Errorf("decrypt: read the spooled file: %w", disk.err)
	case body.err != nil:
		return e, &Held{reason.PGPCorrupt, "the OpenPGP message is cut short or fails its integrity check"}, nil
	case err != nil:
		return e, nil, err
	}
	var held *Held
	switch {
	case md.IsSigned && len(verify) > 0 && (md.SignedBy == nil || md.Signature == nil || md.SignatureError != nil):
		held = &Held{reason.PGPBadSignature, "the signature is not from a key of verify_keys_file, or does not match the contents"}
	case cfg.RequireSignature && !md.IsSigned:
		held = &Held{reason.PGPUnsigned, "the feed requires a signature and the file is not signed"}
	case nested:
		held = &Held{reason.ArchiveNested, "the decrypted file is compressed"}
	}
	if held != nil {
		if j.DropPlain != nil {
			j.DropPlain(e)
		}
		return e, held, nil
	}
	return e, nil, nil
}
