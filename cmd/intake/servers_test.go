package main

import (
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// On every partner server the tests start, `intake check` and `intake
// run --once` agree: both pass, or both fail naming the same reason. check
// prints the server's measured profile, and `intake status` shows the
// profile the run kept.
func TestCheckAndRunAgreeOnEveryPartnerServerAndShowItsProfile(t *testing.T) {
	wants := map[string]struct {
		ok      bool
		profile string
	}{
		testenv.ServerOpenSSH:      {true, "rename refuses an existing target; extensions posix-rename,hardlink,fsync,statvfs; empty dirs persist; mtime 1s; names case-sensitive; realpath ok"},
		testenv.ServerProFTPD:      {true, "rename refuses an existing target; extensions posix-rename,hardlink,fsync,statvfs; empty dirs persist; mtime 1s; names case-sensitive; realpath ok"},
		testenv.ServerRcloneLocal:  {false, "rename overwrites; extensions posix-rename,hardlink,statvfs; empty dirs persist; mtime 1s; names case-sensitive; realpath ok"},
		testenv.ServerRcloneMemory: {false, "rename overwrites; extensions posix-rename,hardlink,statvfs; empty dirs persist; mtime 1s; names case-sensitive; realpath ok"},
	}
	for _, srv := range testenv.Servers() {
		want, ok := wants[srv.Name]
		if !ok {
			t.Fatalf("server %s has no expectation here", srv.Name)
		}
		t.Run(srv.Name, func(t *testing.T) {
			url, pool := testenv.DB(t)
			t.Setenv("INTAKE_DATABASE_URL", url)
			site := srv.NewSite(t, "srv")
			cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
			site.Drop(t, "orders-srv.csv", testenv.OrdersCSV("S", 2))

			checkCode, checkOut := runCLI("check", "--config", cfg)
			if !strings.Contains(checkOut, "partner srv server profile: "+want.profile+"\n") {
				t.Fatalf("check does not print the profile %q:\n%s", want.profile, checkOut)
			}
			runCode, runOut := runCLI("run", "--config", cfg, "--once")
			_, statusOut := runCLI("status", "--config", cfg)
			if !strings.Contains(statusOut, "): "+want.profile+"\n") || !strings.Contains(statusOut, "server profile (measured ") {
				t.Fatalf("status does not show the profile %q:\n%s", want.profile, statusOut)
			}
			archived := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'srv' AND state = 'archived'`)
			if want.ok {
				if checkCode != 0 || runCode != 0 || archived != 1 {
					t.Fatalf("check %d, run %d, %d archived: want both to pass and the file archived\ncheck:\n%s\nrun:\n%s", checkCode, runCode, archived, checkOut, runOut)
				}
				return
			}
			const reason = "the server's SFTP RENAME overwrites an existing target"
			if checkCode == 0 || runCode == 0 || !strings.Contains(checkOut, reason) || !strings.Contains(runOut+statusOut, reason) {
				t.Fatalf("check %d, run %d: want both to refuse with %q\ncheck:\n%s\nrun:\n%s\nstatus:\n%s", checkCode, runCode, reason, checkOut, runOut, statusOut)
			}
			if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'srv'`); n != 0 {
				t.Fatalf("%d files taken from a refused server", n)
			}
		})
	}
}
