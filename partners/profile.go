package partners

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Profile is what a partner's server was measured to do, in a scratch
// directory intake owns on the site (processing/<worker>/): what the claim
// and archive protocol relies on, and what an operator onboarding the
// partner wants to know of a server nobody here wrote.
type Profile struct {
	// RenameOverwrites: a plain SFTP RENAME replaced an existing target
	// (object-store gateways, rclone serve sftp) instead of failing (as
	// OpenSSH's and ProFTPD's do).
	RenameOverwrites bool
	// The extensions the server offers (its SSH_FXP_VERSION reply).
	PosixRename bool // posix-rename@openssh.com
	Hardlink    bool // hardlink@openssh.com
	Fsync       bool // fsync@openssh.com
	StatVFS     bool // statvfs@openssh.com
	// Offered but failing when used: each offered extension of the three
	// below is used once on probe files (posix-rename onto an existing
	// name, fsync of a probe file's handle, statvfs of the scratch directory),
	// and one that answers with an error is marked here. intake uses
	// posix-rename alone (a receipt's publish, which falls back to remove
	// and RENAME); hardlink is not used and not tried.
	PosixRenameFails, FsyncFails, StatVFSFails bool
	// EmptyDirPersists: a directory made and left empty is still listed
	// (an object store may keep a directory only while it holds a file).
	EmptyDirPersists bool
	// MtimeStep is the step of the modification times the server keeps
	// when a client sets them: 1s (SFTP v3 carries whole seconds), 2s
	// (FAT-like), or 0 when a time set is not kept (the server stamps its
	// own, as object stores do at upload end).
	MtimeStep time.Duration
	// RenameRestampsMTime: a file's modification time is not kept across
	// a RENAME (a gateway whose RENAME is a copy stamps the copy's time),
	// or the server keeps no time as set (MtimeStep 0). A claimed file is
	// then known by its size alone: its time in processing/ is the
	// claim's, not the listing's.
	RenameRestampsMTime bool
	// CaseInsensitive: a name differing only by case found the file.
	CaseInsensitive bool
	// RealPath: REALPATH of the scratch directory answered an absolute path.
	RealPath bool
	// The server's limits, measured by `intake check` only (sftpconn.Probe:
	// MeasureLimits; the daemon's daily measurement leaves them 0, not
	// measured, to cost no transfer). MaxRead is the most bytes the
	// server answered one READ of MaxReadProbe bytes with (0 also on a
	// site that allows no second channel); intake's reads ask for less
	// (pkg/sftp's 32 KiB packets). Handles is how many handles of one file
	// the server let one session hold open at once, up to MaxHandlesProbe
	// (which means that many or more); intake holds a few per session.
	// Channels is how many sftp subsystems one SSH connection started at
	// once, up to MaxChannelsProbe (that many or more): sshd's
	// MaxSessions, ProFTPD's SFTPMaxChannels, a server that starts one
	// subsystem a connection (1). A session uses up to three (main,
	// listing, a large file's second channel) and connections are shared
	// by partners on one account (sftpconn.Conns.SetChannels).
	MaxRead, Handles, Channels int
}

// ProbePrefix begins the names of a measurement's probe files and
// directory in processing/<worker>/; a measurement killed part way leaves
// them, and the worker removes them when it next looks through its dir.
const ProbePrefix = ".intake-probe-"

// What the limits are measured up to (sftpconn: MeasureLimits,
// MeasureChannels).
const (
	MaxReadProbe     = 256 << 10
	MaxHandlesProbe  = 64
	MaxChannelsProbe = 8
)

// ErrRenameOverwrites refuses a partner with readiness: stable on a server
// whose plain RENAME replaces an existing target. Such a server is served
// otherwise (sftpconn.Session.SetRenameOverwrites: intake makes sure of each
// rename's target itself), but readiness stable puts a file that changed
// after its claim back into ready/, and on such a server that move could
// replace a file the partner has published there meanwhile.
var ErrRenameOverwrites = errors.New("the server's SFTP RENAME overwrites an existing target, and readiness stable would move claimed files back into ready/ over what the partner publishes there; use readiness rename or manifest on this server")

// Serves reports whether partner c can be served safely on a server of
// this profile: every server can, but a partner with readiness stable
// only where RENAME refuses an existing target (ErrRenameOverwrites).
func (p Profile) Serves(c *Config) error {
	if p.RenameOverwrites && c.Readiness == ReadinessStable {
		return ErrRenameOverwrites
	}
	return nil
}

// String is the profile as `intake check` prints it and `intake status`
// shows it: one line, each measurement named.
func (p Profile) String() string {
	var ext []string
	for _, e := range []struct {
		on, fails bool
		name      string
	}{{p.PosixRename, p.PosixRenameFails, "posix-rename"}, {p.Hardlink, false, "hardlink"}, {p.Fsync, p.FsyncFails, "fsync"},
		{p.StatVFS, p.StatVFSFails, "statvfs"}} {
		switch {
		case e.on && e.fails:
			ext = append(ext, e.name+" (offered, fails)")
		case e.on:
			ext = append(ext, e.name)
		}
	}
	if len(ext) == 0 {
		ext = []string{"none"}
	}
	pick := func(on bool, yes, no string) string {
		if on {
			return yes
		}
		return no
	}
	mtime := "not kept as set"
	if p.MtimeStep > 0 {
		mtime = p.MtimeStep.String()
	}
	if p.MtimeStep > 0 && p.RenameRestampsMTime {
		mtime += ", not kept across a rename"
	}
	out := fmt.Sprintf("rename %s; extensions %s; empty dirs %s; mtime %s; names %s; realpath %s",
		pick(p.RenameOverwrites, "overwrites", "refuses an existing target"),
		strings.Join(ext, ","),
		pick(p.EmptyDirPersists, "persist", "vanish"),
		mtime,
		pick(p.CaseInsensitive, "case-insensitive", "case-sensitive"),
		pick(p.RealPath, "ok", "fails"))
	if p.Handles == 0 && p.Channels == 0 {
		return out // limits not measured (the daemon's measurement)
	}
	read := "not measured"
	if p.MaxRead > 0 {
		read = fmt.Sprintf("%d KiB", p.MaxRead>>10)
		if p.MaxRead&1023 != 0 {
			read = fmt.Sprintf("%d bytes", p.MaxRead)
		}
	}
	handles := fmt.Sprint(p.Handles)
	if p.Handles >= MaxHandlesProbe {
		handles = fmt.Sprintf("%d or more", MaxHandlesProbe)
	}
	channels := fmt.Sprint(p.Channels)
	if p.Channels >= MaxChannelsProbe {
		channels = fmt.Sprintf("%d or more", MaxChannelsProbe)
	}
	return out + fmt.Sprintf("; largest read %s; open handles %s; channels a connection %s", read, handles, channels)
}
