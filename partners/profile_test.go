package partners_test

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/partners"
)

// stampedInfo is a file's stat with another modification time.
type stampedInfo struct {
	os.FileInfo
	mtime time.Time
}

func (s stampedInfo) ModTime() time.Time { return s.mtime }

// The profile check and the daemon measure is each server's own: on
// pkg/sftp's in-process server (which offers posix-rename, hardlink and
// statvfs, refuses RENAME over an existing name and keeps no time a
// client sets) as it is, and made to behave as other servers do, each
// measurement follows the server, and the probe leaves nothing in the
// scratch directory.
func TestTheProfileMeasuresWhatTheServerDoes(t *testing.T) {
	inProcess := partners.Profile{PosixRename: true, Hardlink: true, StatVFS: true, EmptyDirPersists: true, RealPath: true}
	for _, tc := range []struct {
		name  string
		setup func(*sftpd.Server)
		want  func(p partners.Profile) partners.Profile
	}{
		{"as it is", func(*sftpd.Server) {}, func(p partners.Profile) partners.Profile { return p }},
		{"a RENAME that overwrites", (*sftpd.Server).RenameOverwrites,
			func(p partners.Profile) partners.Profile { p.RenameOverwrites = true; return p }},
		{"names found by another case", (*sftpd.Server).CaseInsensitiveStat,
			func(p partners.Profile) partners.Profile { p.CaseInsensitive = true; return p }},
		{"an empty directory not listed", func(srv *sftpd.Server) {
			srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
				var out entries
				for _, fi := range truth {
					if method == "List" && fi.IsDir() && strings.HasPrefix(fi.Name(), ".intake-probe-") {
						continue
					}
					out = append(out, fi)
				}
				return out
			})
		}, func(p partners.Profile) partners.Profile { p.EmptyDirPersists = false; return p }},
		{"times kept in two-second steps", func(srv *sftpd.Server) {
			srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
				if method == "Lstat" && strings.HasPrefix(path.Base(p), ".intake-probe-b-") {
					// 00:00:01 set, 00:00:02 kept
					return entries{stampedInfo{truth[0], time.Unix(978307202, 0)}}
				}
				return entries(truth)
			})
		}, func(p partners.Profile) partners.Profile { p.MtimeStep = 2 * time.Second; return p }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "ready"), 0o755)
			srv, p := inProcessSite(t, root)
			tc.setup(srv)
			got, err := partners.Probe(context.Background(), p, "w1")
			want := tc.want(inProcess)
			if got != want {
				t.Fatalf("measured %s\nwant     %s", got, want)
			}
			if want.RenameOverwrites != (err != nil) {
				t.Fatalf("probe: %v; want it to fail exactly when RENAME overwrites", err)
			}
			if ents, err := os.ReadDir(filepath.Join(root, "processing", "w1")); err != nil || len(ents) != 0 {
				t.Fatalf("the probe left %v (%v)", ents, err)
			}
		})
	}
}
