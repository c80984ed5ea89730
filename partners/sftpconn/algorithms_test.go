package sftpconn_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// writeRSAKey stores a new RSA private key in OpenSSH format at path and
// returns its public key.
func writeRSAKey(t *testing.T, path string) ssh.PublicKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(k, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// A real sshd that offers only SHA-1 algorithms of one kind is refused by
// default, naming what found no common algorithm, and served with
// sftp.legacy_algorithms: a SHA-1 key exchange, a SHA-1 MAC (with a
// cipher that needs one), a host key proven only by ssh-rsa signatures.
// (intake's own RSA key: TestAnRSAClientKeySignsWithSHA2Only; OpenSSH
// always sends server-sig-algs, so it never meets the fallback.)
func TestSHA1AlgorithmsOnlyWithLegacyAlgorithms(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sshd    func(dir string) []string // sshd_config lines, given a directory for keys
		rsaHost bool                      // pin an RSA host key (HostKey rsa) instead of sshdtest's ed25519
		refused string                    // in the default's error
	}{
		{name: "key exchange", sshd: func(string) []string { return []string{"KexAlgorithms diffie-hellman-group14-sha1"} },
			refused: "no common algorithm for key exchange"},
		{name: "mac", sshd: func(string) []string { return []string{"Ciphers aes128-ctr", "MACs hmac-sha1,hmac-sha1-96"} },
			refused: "no common algorithm for client to server MAC"},
		{name: "host key", rsaHost: true, sshd: func(dir string) []string {
			return []string{"HostKey " + filepath.Join(dir, "host_rsa"), "HostKeyAlgorithms ssh-rsa"}
		}, refused: "no common algorithm for host key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var hostPub ssh.PublicKey
			if tc.rsaHost {
				hostPub = writeRSAKey(t, filepath.Join(dir, "host_rsa"))
			}
			srv, err := sshdtest.StartConfig(tc.sshd(dir)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			p := partnerOn(t, srv, "old")
			if tc.rsaHost {
				p.SFTP.KnownHostsFile = filepath.Join(dir, "known_hosts")
				if err := os.WriteFile(p.SFTP.KnownHostsFile, []byte(knownhosts.Line([]string{srv.Addr}, hostPub)+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}

			s, err := sftpconn.Dial(context.Background(), p)
			if err == nil {
				s.Close()
				t.Fatal("a site that offers only SHA-1 was served by default")
			}
			if !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("refused with %v, want %q", err, tc.refused)
			}

			p.SFTP.LegacyAlgorithms = true
			s, err = sftpconn.Dial(context.Background(), p)
			if err != nil {
				t.Fatalf("with legacy_algorithms: %v", err)
			}
			defer s.Close()
			if _, err := s.Stat(s.Layout.ReadyDir()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
