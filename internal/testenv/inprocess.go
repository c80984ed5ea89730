package testenv

import (
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners"
)

// InProcessServer serves root as / over pkg/sftp's request server
// (internal/sftpd) to user, with a generated host key pinned in a
// known_hosts file of its own and a generated client key; the server
// stops with t. It returns the server and the partner's sftp settings.
func InProcessServer(t testing.TB, root, user string) (*sftpd.Server, partners.SFTP) {
	t.Helper()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	host, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	clientKey := filepath.Join(t.TempDir(), "client")
	pub, err := sshdtest.WriteKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sftpd.Start("127.0.0.1:0", host, []sftpd.User{{Name: user, Key: pub, Root: root}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	kh := filepath.Join(t.TempDir(), "kh")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{srv.Addr()}, host.PublicKey())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, partners.SFTP{Address: srv.Addr(), User: user, PrivateKeyFile: clientKey,
		KnownHostsFile: kh, Root: "/", DialTimeout: 5 * time.Second, Keepalive: time.Minute}
}

// NewInProcessSite is NewSite on an in-process server of its own
// (InProcessServer), for a site whose server behaves as OpenSSH's does
// not (RENAME that overwrites, say).
func NewInProcessSite(t testing.TB, id string) (*sftpd.Server, *Site) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"incoming", "ready"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	srv, sftp := InProcessServer(t, root, id)
	return srv, &Site{Root: root, Config: partners.Config{ID: id, SFTP: sftp, Feeds: []partners.Feed{OrdersFeed()}}}
}
