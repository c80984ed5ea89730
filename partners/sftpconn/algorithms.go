package sftpconn

import (
	"fmt"
	"slices"

	"golang.org/x/crypto/ssh"
)

// The SSH algorithms intake offers a site, in order of preference, named
// in full rather than left to x/crypto/ssh's defaults, which include
// SHA-1 ones (diffie-hellman-group14-sha1, hmac-sha1, hmac-sha1-96, ssh-rsa
// signatures). They are OpenSSH 9's defaults as far as x/crypto/ssh
// implements them (it has no diffie-hellman-group18-sha512 and no
// sntrup761x25519-sha512; it has mlkem768x25519-sha256, which OpenSSH 9.9
// adds): no SHA-1 key exchange, MAC or signature. The ciphers and MACs keep
// x/crypto/ssh's order, so a site negotiates what it did before.
var (
	keyExchanges = []string{
		ssh.KeyExchangeMLKEM768X25519,
		ssh.KeyExchangeCurve25519, // x/crypto adds curve25519-sha256@libssh.org behind it
		ssh.KeyExchangeECDHP256,
		ssh.KeyExchangeECDHP384,
		ssh.KeyExchangeECDHP521,
		ssh.KeyExchangeDH16SHA512,
		ssh.KeyExchangeDH14SHA256,
	}
	ciphers = []string{
		ssh.CipherAES128GCM,
		ssh.CipherAES256GCM,
		ssh.CipherChaCha20Poly1305,
		ssh.CipherAES128CTR,
		ssh.CipherAES192CTR,
		ssh.CipherAES256CTR,
	}
	macs = []string{
		ssh.HMACSHA256ETM,
		ssh.HMACSHA512ETM,
		ssh.HMACSHA256,
		ssh.HMACSHA512,
	}
	// rsaSignatures: what an RSA key signs with, for the site's host key
	// and for intake's own client key.
	rsaSignatures = []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}

	// With sftp.legacy_algorithms the SHA-1 ones are offered too, after
	// all of the above: a site that has anything better still gets it.
	legacyKeyExchanges = []string{ssh.InsecureKeyExchangeDH14SHA1}
	legacyMACs         = []string{ssh.HMACSHA1, ssh.InsecureHMACSHA196}
	legacyRSASignature = ssh.KeyAlgoRSA
)

// sshAlgorithms returns the key exchanges, ciphers and MACs offered to a
// site: the SHA-1 ones only when legacy (sftp.legacy_algorithms).
func sshAlgorithms(legacy bool) ssh.Config {
	c := ssh.Config{
		KeyExchanges: slices.Clone(keyExchanges),
		Ciphers:      slices.Clone(ciphers),
		MACs:         slices.Clone(macs),
	}
	if legacy {
		c.KeyExchanges = append(c.KeyExchanges, legacyKeyExchanges...)
		c.MACs = append(c.MACs, legacyMACs...)
	}
	return c
}

// hostKeyAlgorithmsFor maps a pinned key type to the signature algorithms
// that prove it: an RSA key by rsa-sha2-512 or rsa-sha2-256, and by ssh-rsa
// (SHA-1) only when legacy.
func hostKeyAlgorithmsFor(keyType string, legacy bool) []string {
	if keyType == ssh.KeyAlgoRSA {
		a := slices.Clone(rsaSignatures)
		if legacy {
			a = append(a, legacyRSASignature)
		}
		return a
	}
	return []string{keyType}
}

// clientSigner restricts intake's own RSA key to rsa-sha2-512 and
// rsa-sha2-256 signatures unless legacy: x/crypto/ssh would sign with
// ssh-rsa (SHA-1) for a server that sends no server-sig-algs. Such a
// server then refuses the login. Other key types sign as they are.
func clientSigner(signer ssh.Signer, legacy bool) (ssh.Signer, error) {
	if legacy || signer.PublicKey().Type() != ssh.KeyAlgoRSA {
		return signer, nil
	}
	as, ok := signer.(ssh.AlgorithmSigner)
	if !ok {
		return nil, fmt.Errorf("an RSA key that cannot choose its signature algorithm (SHA-2 needed)")
	}
	return ssh.NewSignerWithAlgorithms(as, rsaSignatures)
}
