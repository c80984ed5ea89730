package partners

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/pkg/sftp"
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
	// name, fsync of a file written, statvfs of the scratch directory),
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
	// The server's limits, measured by `intake check` only (Probe:
	// MeasureLimits; the daemon's daily measurement leaves them 0, not
	// measured, to cost no transfer). MaxRead is the most bytes the
	// server answered one READ of maxReadProbe bytes with (0 also on a
	// site that allows no second channel); intake's reads ask for less
	// (pkg/sftp's 32 KiB packets). Handles is how many handles of one file
	// the server let one session hold open at once, up to maxHandlesProbe
	// (which means that many or more); intake holds a few per session.
	// Channels is how many sftp subsystems one SSH connection started at
	// once, up to maxChannelsProbe (that many or more): sshd's
	// MaxSessions, ProFTPD's SFTPMaxChannels, a server that starts one
	// subsystem a connection (1). A session uses up to three (main,
	// listing, a large file's second channel) and connections are shared
	// by partners on one account (Conns.SetChannels).
	MaxRead, Handles, Channels int
}

// ProbePrefix begins the names of a measurement's probe files and
// directory in processing/<worker>/; a measurement killed part way leaves
// them, and the worker removes them when it next looks through its dir.
const ProbePrefix = ".intake-probe-"

// What the limits are measured up to.
const (
	maxReadProbe     = 256 << 10
	maxHandlesProbe  = 64
	maxChannelsProbe = 8
)

// ErrRenameOverwrites refuses a partner with readiness: stable on a server
// whose plain RENAME replaces an existing target. Such a server is served
// otherwise (Session.SetRenameOverwrites: intake makes sure of each
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
	if p.Handles >= maxHandlesProbe {
		handles = fmt.Sprintf("%d or more", maxHandlesProbe)
	}
	channels := fmt.Sprint(p.Channels)
	if p.Channels >= maxChannelsProbe {
		channels = fmt.Sprintf("%d or more", maxChannelsProbe)
	}
	return out + fmt.Sprintf("; largest read %s; open handles %s; channels a connection %s", read, handles, channels)
}

// mtimeProbe is the time set on a probe file: an odd second, so a server
// that keeps two-second steps (FAT) shows itself, long past, so a server
// that stamps its own time cannot return it by chance.
var mtimeProbe = time.Unix(978307201, 0) // 2001-01-01T00:00:01Z

// MeasureProfile measures the server in processing/<worker>/ (made sure
// of by Prepare or EnsureDirs) with dot-names of intake's own, each
// removed after: three files, one renamed onto another with
// posix-rename, then one onto the other with RENAME; a directory left
// empty; the time set on a file; the file's name in upper case; REALPATH
// and statvfs of the directory; fsync of a file written. The extensions
// are the server's own list, each used (but hardlink) to see that it
// works. Nothing is written outside the scratch directory and nothing of
// the partner's is touched.
func (s *Session) MeasureProfile(worker string) (Profile, error) {
	var p Profile
	for _, e := range []struct {
		on   *bool
		name string
	}{{&p.PosixRename, "posix-rename@openssh.com"}, {&p.Hardlink, "hardlink@openssh.com"},
		{&p.Fsync, "fsync@openssh.com"}, {&p.StatVFS, "statvfs@openssh.com"}} {
		_, *e.on = s.Client.HasExtension(e.name)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	dir := s.Layout.ProcessingDir(worker)
	a := path.Join(dir, ProbePrefix+"a-"+tag)
	bb := path.Join(dir, ProbePrefix+"b-"+tag)
	c := path.Join(dir, ProbePrefix+"c-"+tag)
	d := path.Join(dir, ProbePrefix+"d-"+tag)
	defer s.Remove(a)
	defer s.Remove(bb)
	defer s.Remove(c)
	defer s.RemoveDirectory(d)
	for _, name := range []string{a, bb, c} {
		f, err := s.Create(name)
		if err != nil {
			return p, fmt.Errorf("%s is not writable: %w", dir, s.Deadline(err))
		}
		_, err = f.Write([]byte(name))
		if err == nil && name == bb && p.Fsync {
			// fsync@openssh.com on the handle written: an error is an
			// extension offered that does not work
			p.FsyncFails = f.Sync() != nil
		}
		f.Close()
		if err != nil {
			return p, fmt.Errorf("write in %s: %w", dir, s.Deadline(err))
		}
		if s.TimedOut() {
			return p, s.Deadline(os.ErrDeadlineExceeded)
		}
	}
	// names: the second file under its name in upper case (the tag's hex
	// letters and the prefix change; a case-sensitive server has no such
	// file)
	if _, err := s.Lstat(path.Join(dir, strings.ToUpper(path.Base(bb)))); err == nil {
		p.CaseInsensitive = true
	} else if s.TimedOut() {
		return p, s.Deadline(err)
	}
	// mtime: set on the second file, read back
	if err := s.Client.Chtimes(bb, mtimeProbe, mtimeProbe); err == nil {
		if fi, err := s.Lstat(bb); err == nil {
			switch diff := fi.ModTime().Sub(mtimeProbe).Abs(); {
			case diff == 0:
				p.MtimeStep = time.Second
			case diff <= 2*time.Second:
				p.MtimeStep = 2 * time.Second
			}
		}
	}
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}
	// the time set, across a RENAME: kept, or the rename's own (a copy);
	// a server that keeps no time as set is taken as one that stamps
	// its own at a rename too (nothing of its times is relied on)
	p.RenameRestampsMTime = true
	if p.MtimeStep > 0 {
		e := path.Join(dir, ProbePrefix+"e-"+tag)
		defer s.Remove(e)
		if err := s.Rename(bb, e); err == nil {
			if fi, err := s.Lstat(e); err == nil {
				p.RenameRestampsMTime = fi.ModTime().Sub(mtimeProbe).Abs() > p.MtimeStep
			}
			if err := s.Rename(e, bb); err != nil {
				return p, fmt.Errorf("rename in %s: %w", dir, s.Deadline(err))
			}
		}
	}
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}
	// an empty directory: still there when its parent is listed
	if err := s.Client.Mkdir(d); err == nil {
		if fis, err := s.ReadDir(dir); err == nil {
			for _, fi := range fis {
				if fi.Name() == path.Base(d) && fi.IsDir() {
					p.EmptyDirPersists = true
				}
			}
		}
	}
	if rp, err := s.Client.RealPath(dir); err == nil && strings.HasPrefix(rp, "/") {
		p.RealPath = true
	}
	if p.StatVFS {
		_, err := s.Client.StatVFS(dir)
		p.StatVFSFails = err != nil
	}
	if p.PosixRename {
		// what it is for: replacing an existing name (pkg/sftp's request
		// server offers it and, without a handler of its own, makes it a
		// plain RENAME, which refuses)
		p.PosixRenameFails = s.Client.PosixRename(c, bb) != nil
	}
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}

	// last, as it leaves one file of the two: the RENAME onto an existing name
	p.RenameOverwrites = s.Rename(a, bb) == nil
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}
	return p, nil
}

// MeasureLimits measures the server's limits in processing/<worker>/
// (Profile.MaxRead, Profile.Handles) with a probe file of maxReadProbe
// bytes of its own, removed after: `intake check` runs it when a partner
// is onboarded; the daemon does not (256 KiB each way per partner).
func (s *Session) MeasureLimits(worker string) (maxRead, handles int) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := path.Join(s.Layout.ProcessingDir(worker), ProbePrefix+"r-"+hex.EncodeToString(b[:]))
	defer s.Remove(r)
	maxRead = s.measureRead(r)
	return maxRead, s.measureHandles(r)
}

// measureHandles opens the file p up to maxHandlesProbe times at once
// (pkg/sftp keeps the OPENs in flight together) and counts the handles the
// server gave, closing each.
func (s *Session) measureHandles(p string) int {
	files := make([]*sftp.File, maxHandlesProbe)
	var wg sync.WaitGroup
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if f, err := s.Client.Open(p); err == nil {
				files[i] = f
			}
		}()
	}
	wg.Wait()
	n := 0
	for _, f := range files {
		if f != nil {
			n++
			f.Close()
		}
	}
	return n
}

// measureRead writes maxReadProbe bytes to p and reads them back with one
// READ on the listing channel: the bytes the server answers with are the
// most it serves at once. 0 when the site allows no second channel or the
// read fails.
func (s *Session) measureRead(p string) int {
	f, err := s.Create(p)
	if err != nil {
		return 0
	}
	_, err = f.Write(make([]byte, maxReadProbe))
	f.Close()
	if err != nil {
		return 0
	}
	c, h, err := s.openListed(p, fxfRead)
	if err != nil {
		return 0
	}
	defer c.closeHandle(h)
	rd, err := c.start(fxpRead, str(h), binary.BigEndian.AppendUint64(nil, 0), u32(maxReadProbe))
	if err != nil {
		return 0
	}
	rep := <-rd
	if rep.err != nil || rep.typ != fxpData {
		return 0
	}
	d := decoder{b: rep.body}
	b := d.str()
	if d.err != nil {
		return 0
	}
	return len(b)
}

// MeasureChannels counts the sftp subsystems the session's SSH connection
// starts at once, up to maxChannelsProbe: the session's own channels, and
// more opened beside them (each started and its SFTP version exchanged,
// in an op timeout) until the server refuses one; then those are closed.
// `intake check` runs it on a connection of its own (Dial); the daemon
// does not. A refusal may be the channel's open (sshd's MaxSessions,
// ProFTPD's SFTPMaxChannels) or the subsystem's start (a server that
// starts one a connection).
func (s *Session) MeasureChannels() int {
	n := 1 // the main channel
	if !s.noLister {
		n++
	}
	s.rangeMu.Lock()
	if s.ranges != nil {
		n++
	}
	s.rangeMu.Unlock()
	var extra []*sftp.Client
	defer func() {
		for _, c := range extra {
			c.Close()
		}
	}()
	for n < maxChannelsProbe {
		c, err := inTime(s, func() (*sftp.Client, error) { return s.newSFTP(newWatchdog(s.watch.timeout)) }, func(c *sftp.Client) { c.Close() })
		if err != nil {
			break
		}
		extra = append(extra, c)
		n++
	}
	return n
}
