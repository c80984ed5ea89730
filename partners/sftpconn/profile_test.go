package sftpconn_test

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// stampedInfo is a file's stat with another modification time.
type stampedInfo struct {
	os.FileInfo
	mtime time.Time
}

func (s stampedInfo) ModTime() time.Time { return s.mtime }

// The profile check and the daemon measure is each server's own: on
// pkg/sftp's in-process server (which offers posix-rename, hardlink and
// statvfs, but without handlers of ours fails statvfs and makes
// posix-rename a plain RENAME, which refuses an existing name; refuses
// RENAME over an existing name; keeps the times a client sets, in whole
// seconds, across a RENAME too; starts as
// many channels as asked) as it is, and made to behave as other servers
// do, each measurement follows the server, and the probe leaves nothing
// in the scratch directory. Every server passes the probe with readiness
// rename; with readiness stable, a server whose RENAME overwrites is
// refused.
func TestTheProfileMeasuresWhatTheServerDoes(t *testing.T) {
	inProcess := partners.Profile{PosixRename: true, Hardlink: true, StatVFS: true, EmptyDirPersists: true, RealPath: true,
		PosixRenameFails: true, StatVFSFails: true, MaxRead: 32 << 10, Handles: 64, Channels: 8, MtimeStep: time.Second}
	for _, tc := range []struct {
		name  string
		setup func(*sftpd.Server)
		want  func(p partners.Profile) partners.Profile
	}{
		{"as it is", func(*sftpd.Server) {}, func(p partners.Profile) partners.Profile { return p }},
		{"a RENAME that overwrites", (*sftpd.Server).RenameOverwrites,
			// posix-rename, a plain RENAME here, replaces too
			func(p partners.Profile) partners.Profile {
				p.RenameOverwrites, p.PosixRenameFails = true, false
				return p
			}},
		{"a RENAME that is a copy, stamped with its own time", (*sftpd.Server).RenameCopies,
			func(p partners.Profile) partners.Profile { p.RenameRestampsMTime = true; return p }},
		{"one sftp subsystem a connection", (*sftpd.Server).OneSubsystemPerConnection,
			// the largest read is measured on the listing channel, which
			// such a server refuses
			func(p partners.Profile) partners.Profile { p.Channels, p.MaxRead = 1, 0; return p }},
		{"reads answered with 4 KiB at most", func(srv *sftpd.Server) { srv.ShortReads(4096) },
			func(p partners.Profile) partners.Profile { p.MaxRead = 4096; return p }},
		{"two files of a session open at most", func(srv *sftpd.Server) { srv.MaxHandles(2) },
			// the probes side by side hold up to five: refused, the
			// measure runs one probe at a time
			func(p partners.Profile) partners.Profile { p.Handles = 2; return p }},
		{"names found by another case", (*sftpd.Server).CaseInsensitiveStat,
			func(p partners.Profile) partners.Profile { p.CaseInsensitive = true; return p }},
		{"an empty directory not listed", func(srv *sftpd.Server) {
			srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
				var out sftpd.Entries
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
					return sftpd.Entries{stampedInfo{truth[0], time.Unix(978307202, 0)}}
				}
				return sftpd.Entries(truth)
			})
		}, func(p partners.Profile) partners.Profile { p.MtimeStep = 2 * time.Second; return p }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "ready"), 0o755)
			srv, p := inProcessSite(t, root)
			tc.setup(srv)
			got, err := sftpconn.Probe(context.Background(), p, "w1")
			want := tc.want(inProcess)
			if got != want {
				t.Fatalf("measured %s\nwant     %s", got, want)
			}
			if err != nil {
				t.Fatalf("probe: %v; want every server served with readiness rename", err)
			}
			// readiness stable puts files back into ready/: refused where
			// RENAME overwrites, and only there
			p.Readiness = partners.ReadinessStable
			if _, err := sftpconn.Probe(context.Background(), p, "w1"); want.RenameOverwrites != errors.Is(err, partners.ErrRenameOverwrites) || want.RenameOverwrites != (err != nil) {
				t.Fatalf("probe with readiness stable: %v; want it refused exactly when RENAME overwrites", err)
			}
			if ents, err := os.ReadDir(filepath.Join(root, "processing", "w1")); err != nil || len(ents) != 0 {
				t.Fatalf("the probe left %v (%v)", ents, err)
			}
		})
	}
}

// On a server whose RENAME overwrites, a session told so never lets a
// rename replace anything: a target that exists fails the rename as
// OpenSSH's RENAME does (ErrRenameTargetExists), both files kept; a move
// into ready/ or incoming/, where the partner may publish the same name
// at any moment, is refused whether or not the name is there
// (ErrRenameIntoPartnerDir); a free target is renamed to. Untold, the
// same session's RENAME replaces the target: the server does overwrite.
func TestASessionToldRenameOverwritesNeverReplacesATarget(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"ready", "incoming", "processing/w1"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	srv, p := inProcessSite(t, root)
	srv.RenameOverwrites()
	s := dialed(t, p)
	write := func(rel, body string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	proc := func(name string) string { return s.Layout.Processing("w1", name) }

	s.SetRenameOverwrites(true)
	write("ready/a.csv", "new")
	write("processing/w1/a.csv", "claimed earlier")
	if err := s.Rename(s.Layout.Ready("a.csv"), proc("a.csv")); !errors.Is(err, sftpconn.ErrRenameTargetExists) {
		t.Fatalf("rename onto an existing target: %v, want ErrRenameTargetExists", err)
	}
	if o, err := s.RenameAndOpen(s.Layout.Ready("a.csv"), proc("a.csv")); !errors.Is(err, sftpconn.ErrRenameTargetExists) {
		if o != nil {
			o.Discard()
		}
		t.Fatalf("rename-and-open onto an existing target: %v, want ErrRenameTargetExists", err)
	}
	if got, want := read("ready/a.csv")+"|"+read("processing/w1/a.csv"), "new|claimed earlier"; got != want {
		t.Fatalf("after the refused renames: %s, want %s", got, want)
	}
	for _, dst := range []string{s.Layout.Ready("b.csv"), path.Join(s.Layout.IncomingDir(), "b.csv")} {
		if err := s.Rename(proc("a.csv"), dst); !errors.Is(err, sftpconn.ErrRenameIntoPartnerDir) {
			t.Fatalf("rename to %s: %v, want ErrRenameIntoPartnerDir", dst, err)
		}
	}
	if got := read("processing/w1/a.csv"); got != "claimed earlier" {
		t.Fatalf("the claimed file moved: %s", got)
	}
	if err := s.Rename(s.Layout.Ready("a.csv"), proc("free.csv")); err != nil || read("processing/w1/free.csv") != "new" {
		t.Fatalf("rename to a free target: %v, %s", err, read("processing/w1/free.csv"))
	}

	s.SetRenameOverwrites(false)
	if err := s.Rename(proc("free.csv"), proc("a.csv")); err != nil || read("processing/w1/a.csv") != "new" {
		t.Fatalf("untold, the server's RENAME: %v, target %s; want it replaced (the server overwrites)", err, read("processing/w1/a.csv"))
	}
}
