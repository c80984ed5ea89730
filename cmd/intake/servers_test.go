package main

import (
	"os"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// On every partner server the tests start, `intake check` and `intake
// run --once` agree: both pass, or both fail naming the same reason (a
// partner with readiness stable on a server whose RENAME overwrites, as
// rclone's does). check prints the server's measured profile (the limits
// and whether each extension used works with it) and how a server whose
// RENAME overwrites is served, and keeps it; `intake status` shows the
// profile, limits included, after the run.
func TestCheckAndRunAgreeOnEveryPartnerServerAndShowItsProfile(t *testing.T) {
	const (
		refuses    = "rename refuses an existing target; extensions posix-rename,hardlink,fsync,statvfs; empty dirs persist; mtime 1s; names case-sensitive; realpath ok"
		overwrites = "rename overwrites; extensions posix-rename,hardlink,statvfs (offered, fails); empty dirs persist; mtime 1s; names case-sensitive; realpath ok"
		limits     = "; open handles 64 or more; channels a connection 8 or more"
	)
	profiles := map[string]string{
		testenv.ServerOpenSSH:      refuses + "; largest read 255 KiB" + limits,
		testenv.ServerProFTPD:      refuses + "; largest read 256 KiB" + limits,
		testenv.ServerRcloneLocal:  overwrites + "; largest read 32 KiB" + limits,
		testenv.ServerRcloneMemory: overwrites + "; largest read 32 KiB" + limits,
	}
	for _, srv := range testenv.Servers() {
		profile, ok := profiles[srv.Name]
		if !ok {
			t.Fatalf("server %s has no expectation here", srv.Name)
		}
		for _, readiness := range []string{"rename", "stable"} {
			t.Run(srv.Name+"/readiness "+readiness, func(t *testing.T) {
				url, pool := testenv.DB(t)
				t.Setenv("INTAKE_DATABASE_URL", url)
				site := srv.NewSite(t, "srv")
				cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
				if readiness != "rename" {
					b, err := os.ReadFile(cfg)
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(cfg, []byte(strings.Replace(string(b), "    poll:", "    readiness: "+readiness+"\n    poll:", 1)), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				site.Drop(t, "orders-srv.csv", testenv.OrdersCSV("S", 2))

				checkCode, checkOut := runCLI("check", "--config", cfg)
				if !strings.Contains(checkOut, "partner srv server profile: "+profile+"\n") {
					t.Fatalf("check does not print the profile %q:\n%s", profile, checkOut)
				}
				runCode, runOut := runCLI("run", "--config", cfg, "--once")
				_, statusOut := runCLI("status", "--config", cfg)
				if !strings.Contains(statusOut, "): "+profile+"\n") || !strings.Contains(statusOut, "server profile (measured ") ||
					!strings.Contains(statusOut, "server limits measured by intake check ") {
					t.Fatalf("status does not show the profile %q with check's limits:\n%s", profile, statusOut)
				}
				taken := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'srv'`)
				if strings.HasPrefix(profile, overwrites) && readiness == "stable" {
					const reason = "readiness stable would move claimed files back into ready/"
					if checkCode == 0 || runCode == 0 || !strings.Contains(checkOut, reason) || !strings.Contains(runOut+statusOut, reason) {
						t.Fatalf("check %d, run %d: want both to refuse with %q\ncheck:\n%s\nrun:\n%s\nstatus:\n%s", checkCode, runCode, reason, checkOut, runOut, statusOut)
					}
					if taken != 0 {
						t.Fatalf("%d files taken from a refused partner", taken)
					}
					return
				}
				if checkCode != 0 || runCode != 0 {
					t.Fatalf("check %d, run %d: want both to pass\ncheck:\n%s\nrun:\n%s", checkCode, runCode, checkOut, runOut)
				}
				if strings.HasPrefix(profile, overwrites) && !strings.Contains(checkOut, "rename overwrites: intake makes sure of each rename's target first") {
					t.Fatalf("check does not say how it serves a server whose RENAME overwrites:\n%s", checkOut)
				}
				// readiness stable claims a file at its second sighting
				if want := map[string]int64{"rename": 1, "stable": 0}[readiness]; taken != want {
					t.Fatalf("%d files taken by one run, want %d", taken, want)
				}
			})
		}
	}
}
