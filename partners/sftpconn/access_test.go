package sftpconn_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// intake check's access probe on real OpenSSH accounts: a full one, a
// read-only one (internal-sftp -R) and one refused RENAME and REMOVE
// (-P): each verdict is what the server allows, the modes that fit follow,
// and no partner file is touched.
func TestProbeAccessTellsWhichModesFit(t *testing.T) {
	for _, tc := range []struct {
		name, flags string
		want        partners.Access
		fits        string
	}{
		{"full", "", partners.Access{List: partners.CanYes, Read: partners.CanYes, Create: partners.CanYes, Rename: partners.CanYes, Delete: partners.CanYes},
			"readiness rename, manifest or stable"},
		{"read-only", "-R", partners.Access{List: partners.CanYes, Read: partners.CanYes, Create: partners.CanNo, Rename: partners.CanUntried, Delete: partners.CanUntried},
			"only readiness: stable with claim: record"},
		{"no rename or delete", "-P rename,posix-rename,remove", partners.Access{List: partners.CanYes, Read: partners.CanYes, Create: partners.CanYes, Rename: partners.CanNo, Delete: partners.CanNo},
			"only readiness: stable with claim: record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := sshd
			if tc.flags != "" {
				s, err := sshdtest.StartSFTP(tc.flags)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				srv = s
			}
			root, err := srv.PartnerRoot("access-" + strings.ReplaceAll(tc.name, " ", "-"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(root, "ready"), 0o755); err != nil {
				t.Fatal(err)
			}
			partnerFile := filepath.Join(root, "ready", "orders-1.csv")
			if err := os.WriteFile(partnerFile, []byte("id\n1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := &partners.Config{ID: "p1", SFTP: partners.SFTP{Address: srv.Addr, User: srv.User,
				PrivateKeyFile: srv.ClientKeyFile, KnownHostsFile: srv.KnownHostsFile, Root: root},
				Feeds: []partners.Feed{{Name: "f", Pattern: `.*\.csv`, Target: "t", Key: []string{"id"},
					Columns: []partners.Column{{Name: "id", Type: "text", Required: true}}}}}
			p.SetDefaults()
			a, err := sftpconn.ProbeAccess(context.Background(), p, false)
			if err != nil {
				t.Fatal(err)
			}
			left := a.Left
			a.Left = ""
			if a != tc.want {
				t.Fatalf("access %s, want %s", a, tc.want)
			}
			if !strings.Contains(a.Fits(), tc.fits) {
				t.Fatalf("fits %q, want %q", a.Fits(), tc.fits)
			}
			ents, _ := os.ReadDir(filepath.Join(root, "ready"))
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			wantLeft := 1
			if tc.want.Delete == partners.CanNo {
				wantLeft = 2 // the probe file it could not delete, and says so
				if left == "" {
					t.Fatal("a probe file left behind is not reported")
				}
			}
			if len(names) != wantLeft || names[0] != "orders-1.csv" && names[len(names)-1] != "orders-1.csv" {
				t.Fatalf("ready/ holds %v after the probe", names)
			}
			if b, _ := os.ReadFile(partnerFile); string(b) != "id\n1\n" {
				t.Fatalf("the partner's file changed: %q", b)
			}
		})
	}
}
