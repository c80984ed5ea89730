package partners

import (
	"fmt"
	"os"

	"github.com/partner-intake/partner-intake/internal/names"
)

// PGP is a feed's OpenPGP setting: the feed's files are
// encrypted to PrivateKeyFile's key and, when VerifyKeysFile is set,
// signed by one of its keys. Key files are read when they change (their
// mtime or size), never logged; the passphrase comes from the environment
// variable PassphraseEnv only.
type PGP struct {
	// PrivateKeyFile holds intake's secret key(s), armored or binary.
	PrivateKeyFile string `yaml:"private_key_file"`
	// PassphraseEnv names the environment variable that holds the secret
	// key's passphrase; empty for a key without one.
	PassphraseEnv string `yaml:"passphrase_env"`
	// VerifyKeysFile holds the partner's public key(s) a signature must
	// come from.
	VerifyKeysFile string `yaml:"verify_keys_file"`
	// RequireSignature: a file not signed by a key of VerifyKeysFile is
	// held (pgp_unsigned, pgp_bad_signature).
	RequireSignature bool `yaml:"require_signature"`
	// EncryptReportsTo, when set, holds the partner's public key: the
	// file's receipt and rejects report are written encrypted to it
	// (armored, signed by intake's key), their names ending in .asc.
	EncryptReportsTo string `yaml:"encrypt_reports_to"`
}

// Validate checks the setting; key files are read when a file comes.
func (p *PGP) Validate(key string) error {
	if p.PrivateKeyFile == "" {
		return fmt.Errorf("%s.private_key_file: required", key)
	}
	if p.RequireSignature && p.VerifyKeysFile == "" {
		return fmt.Errorf("%s.verify_keys_file: required with require_signature", key)
	}
	if p.PassphraseEnv != "" {
		if !names.EnvName(p.PassphraseEnv) {
			// never echoed: it may be the passphrase itself
			return fmt.Errorf("%s.passphrase_env: must be the name of an environment variable (letters, digits, '_', '.', '-'), not the passphrase", key)
		}
		if _, ok := os.LookupEnv(p.PassphraseEnv); !ok {
			return fmt.Errorf("%s.passphrase_env: the environment variable %s is not set", key, p.PassphraseEnv)
		}
	}
	return nil
}
