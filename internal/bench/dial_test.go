package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// dialTurns is what a session's start on OpenSSH pays one round trip
// after another, counted by the latency proxy (TCP's own handshake is
// the proxy's, not a turn): the key exchange (one: the versions and the
// KEXINITs cross), the user-auth service's request (sent with NEWKEYS),
// x/crypto/ssh's "none" method and its query of the key before the
// signed request (which its API does not let a client skip), both
// channels opened at once, each channel's subsystem request, then SFTP's
// INIT. The INIT cannot go with the subsystem request: OpenSSH confirms
// a session channel with a window of 0 bytes and opens it only once the
// subsystem runs.
const dialTurns = 8

// A session's start on OpenSSH costs the round trips its protocol needs
// and no more (dialTurns): a step that waits for an answer it need not
// wait for counts one more. The proxy delays each way by 250 ms: a turn
// is counted once 450 ms have passed since the last, so the site's
// answers to the two channels' requests, or a request sent late on a
// busy machine, must come that far apart to be taken for two.
func TestASessionStartCostsItsProtocolsRoundTripsAlone(t *testing.T) {
	srv, err := sshdtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	proxy, err := newWANProxy(srv.Addr, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	root, err := srv.PartnerRoot("turns")
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{proxy.Addr()}, srv.HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &partners.Config{ID: "turns", SFTP: partners.SFTP{Address: proxy.Addr(), User: srv.User,
		PrivateKeyFile: srv.ClientKeyFile, KnownHostsFile: kh, Root: root},
		Feeds: []partners.Feed{{Name: "f", Pattern: `.*\.csv`, Target: "t", Key: []string{"id"},
			Columns: []partners.Column{{Name: "id", Type: "text", Required: true}}}}}
	p.SetDefaults()
	if err := p.Validate("turns"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	turns := proxy.Turns()
	t.Logf("%d round trips in %s", turns, time.Since(start))
	// the session works, and the count with it: its first request is one
	// turn more
	if _, err := s.Stat("."); err != nil {
		t.Fatal(err)
	}
	if after := proxy.Turns(); after != turns+1 {
		t.Fatalf("a STAT after the start counted %d round trips, want 1 (the count is off)", after-turns)
	}
	if turns > dialTurns {
		t.Fatalf("the session's start took %d round trips one after another, want at most %d", turns, dialTurns)
	}
}
