package sftpconn

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"slices"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/partner-intake/partner-intake/partners"
)

// intake's RSA client key signs with rsa-sha2-512 and rsa-sha2-256 only:
// x/crypto/ssh falls back to the key's own format, ssh-rsa (SHA-1), for a
// server that sends no server-sig-algs, and the restricted signer has no
// ssh-rsa to fall back to (the login fails instead). With
// legacy_algorithms it signs ssh-rsa again; an ed25519 key is as it was.
func TestAnRSAClientKeySignsWithSHA2Only(t *testing.T) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("session")
	s, err := clientSigner(raw, false)
	if err != nil {
		t.Fatal(err)
	}
	ms, ok := s.(ssh.MultiAlgorithmSigner)
	if !ok || slices.Contains(ms.Algorithms(), ssh.KeyAlgoRSA) || !slices.Contains(ms.Algorithms(), ssh.KeyAlgoRSASHA256) {
		t.Fatalf("the RSA signer's algorithms: %T %v", s, ms)
	}
	if _, err := ms.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSA); err == nil {
		t.Fatal("the RSA client key signed with ssh-rsa (SHA-1)")
	}
	if _, err := ms.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSASHA512); err != nil {
		t.Fatal(err)
	}

	s, err = clientSigner(raw, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.(ssh.AlgorithmSigner).SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSA); err != nil {
		t.Fatalf("legacy_algorithms: ssh-rsa refused: %v", err)
	}

	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	ed, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := clientSigner(ed, false); err != nil || s != ed {
		t.Fatalf("an ed25519 key: %v, %v", s, err)
	}
}

// The lists offered: no SHA-1 key exchange, MAC or host-key signature by
// default; with legacy_algorithms the SHA-1 ones come after all others.
// A partner with legacy_algorithms never shares a connection with one
// without (connKey).
func TestNoSHA1AlgorithmUnlessLegacy(t *testing.T) {
	sha1 := func(a string) bool {
		return a == ssh.InsecureKeyExchangeDH14SHA1 || a == ssh.InsecureKeyExchangeDH1SHA1 || a == ssh.InsecureKeyExchangeDHGEXSHA1 ||
			a == ssh.HMACSHA1 || a == ssh.InsecureHMACSHA196 || a == ssh.KeyAlgoRSA
	}
	c := sshAlgorithms(false)
	for _, a := range slices.Concat(c.KeyExchanges, c.MACs, c.Ciphers, hostKeyAlgorithmsFor(ssh.KeyAlgoRSA, false)) {
		if sha1(a) {
			t.Fatalf("%s offered by default", a)
		}
	}
	if len(c.KeyExchanges) == 0 || len(c.Ciphers) == 0 || len(c.MACs) == 0 {
		t.Fatalf("an empty list leaves x/crypto/ssh's defaults, SHA-1 included: %+v", c)
	}
	l := sshAlgorithms(true)
	if !slices.Contains(l.KeyExchanges, ssh.InsecureKeyExchangeDH14SHA1) || !slices.Contains(l.MACs, ssh.HMACSHA1) ||
		!slices.Contains(hostKeyAlgorithmsFor(ssh.KeyAlgoRSA, true), ssh.KeyAlgoRSA) {
		t.Fatalf("legacy_algorithms: %+v", l)
	}
	if l.KeyExchanges[0] != c.KeyExchanges[0] || l.MACs[0] != c.MACs[0] {
		t.Fatalf("legacy_algorithms put SHA-1 first: %v %v", l.KeyExchanges, l.MACs)
	}
	a, b := &partners.Config{SFTP: partners.SFTP{Address: "h:22", User: "u"}}, &partners.Config{SFTP: partners.SFTP{Address: "h:22", User: "u", LegacyAlgorithms: true}}
	if connKey(a) == connKey(b) {
		t.Fatal("a legacy_algorithms partner shares connections with one without")
	}
}
