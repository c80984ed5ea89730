// Package pgpkeys reads OpenPGP key files for every daemon of the
// process, cached by path and read again when a file changes (a rotated
// key is picked up without a restart): the pipeline's decryption and the
// sealing of reports (intake/sitefile) share the cache.
package pgpkeys

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
)

// keyFile is one key file as last read: re-read when its mtime or size
// changes (a rotated key is picked up without a restart).
type keyFile struct {
	mtime time.Time
	size  int64
	pass  string
	keys  openpgp.EntityList
}

// pgpKeys caches key files by path, for every daemon of the process; a
// key's bytes, passphrase or material are never logged.
var pgpKeys = struct {
	sync.Mutex
	m map[string]*keyFile
}{m: map[string]*keyFile{}}

// Load reads a key file (armored or binary), from the cache while its
// mtime and size are those last read; secret keys are decrypted with the
// passphrase held by the environment variable passEnv.
func Load(file, passEnv string) (openpgp.EntityList, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("pgp key file: %w", err)
	}
	pass := ""
	if passEnv != "" {
		pass = os.Getenv(passEnv)
	}
	pgpKeys.Lock()
	defer pgpKeys.Unlock()
	if k := pgpKeys.m[file]; k != nil && k.mtime.Equal(st.ModTime()) && k.size == st.Size() && k.pass == pass {
		return k.keys, nil
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("pgp key file: %w", err)
	}
	var keys openpgp.EntityList
	if bytes.Contains(raw[:min(len(raw), 64)], []byte("-----BEGIN PGP")) {
		keys, err = openpgp.ReadArmoredKeyRing(bytes.NewReader(raw))
	} else {
		keys, err = openpgp.ReadKeyRing(bytes.NewReader(raw))
	}
	if err != nil {
		return nil, fmt.Errorf("pgp key file %s cannot be read as OpenPGP keys", file)
	}
	for _, e := range keys {
		if err := e.DecryptPrivateKeys([]byte(pass)); err != nil {
			return nil, fmt.Errorf("pgp key file %s: a secret key cannot be unlocked with the passphrase of %s", file, passEnv)
		}
	}
	pgpKeys.m[file] = &keyFile{mtime: st.ModTime(), size: st.Size(), pass: pass, keys: keys}
	return keys, nil
}
