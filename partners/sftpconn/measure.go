package sftpconn

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/partners"
)

// mtimeProbe is the time set on a probe file: an odd second, so a server
// that keeps two-second steps (FAT) shows itself, long past, so a server
// that stamps its own time cannot return it by chance.
var mtimeProbe = time.Unix(978307201, 0) // 2001-01-01T00:00:01Z

// siteProbes measures the server for the check command: its Profile, its
// limits on handles and reads, the channels a connection may open.
type siteProbes struct{ *Session }

// MeasureProfile measures the server in processing/<worker>/ (made sure
// of by Prepare or EnsureDirs) with dot-names of intake's own, each
// removed after: three files, one renamed onto another with
// posix-rename, then one onto the other with RENAME; a directory left
// empty; the time set on two files, one of them renamed; a file's name in
// upper case; REALPATH and statvfs of the directory; fsync of a file's
// handle. The extensions are the server's own list, each used (but
// hardlink) to see that it works. Nothing is written outside the scratch
// directory and nothing of the partner's is touched.
//
// Probes that touch names of their own go out side by side, so the
// measure costs the round trips of its longest chain (nine; eleven on a
// site that allows one channel, where pkg/sftp lists a directory in
// four), not of every request one after another (about thirty: 1.6 s at
// 50 ms): the three files are made at once (OPEN, a WRITE or the fsync,
// CLOSE); then the name's case (on the first file), the times (set on the second
// and third at once, then the second read back beside the third's
// RENAME, then the renamed one read back), the empty directory, REALPATH
// and statvfs at once; then the renames onto an existing name one after
// the other (each must find the second file there, whatever the other
// did); the removals at once.
func (s *siteProbes) MeasureProfile(worker string) (partners.Profile, error) {
	var p partners.Profile
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
	a := path.Join(dir, partners.ProbePrefix+"a-"+tag)
	bb := path.Join(dir, partners.ProbePrefix+"b-"+tag)
	c := path.Join(dir, partners.ProbePrefix+"c-"+tag)
	d := path.Join(dir, partners.ProbePrefix+"d-"+tag)
	e := path.Join(dir, partners.ProbePrefix+"e-"+tag)
	defer sideBySide(func() { s.Remove(a) }, func() { s.Remove(bb) }, func() { s.Remove(c) },
		func() { s.Remove(e) }, func() { s.RemoveDirectory(d) })

	// the three files; the second is not written but synced (fsync
	// proves the extension whether or not a byte was written, and pkg/sftp
	// sends a handle's requests one after another)
	var errs [3]error
	var fsyncFails bool
	write := func(i int, name string) {
		f, err := s.Create(name)
		if err != nil {
			errs[i] = fmt.Errorf("%s is not writable: %w", dir, s.Deadline(err))
			return
		}
		if name == bb {
			if p.Fsync {
				// fsync@openssh.com on the handle: an error is an
				// extension offered that does not work
				fsyncFails = f.Sync() != nil
			}
		} else {
			_, err = f.Write([]byte(name))
		}
		f.Close()
		if err != nil {
			errs[i] = fmt.Errorf("write in %s: %w", dir, s.Deadline(err))
		}
	}
	sideBySide(func() { write(0, a) }, func() { write(1, bb) }, func() { write(2, c) })
	for _, err := range errs {
		if err != nil {
			return p, err
		}
	}
	p.FsyncFails = fsyncFails
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}

	var caseInsensitive, emptyDirPersists, realPath, statVFSFails bool
	var mtimeStep time.Duration
	restamps := true
	cNow := c // where the third file is after the mtime probes
	sideBySide(
		func() {
			// names: the first file under its name in upper case (the
			// tag's hex letters and the prefix change; a case-sensitive
			// server has no such file)
			_, err := s.Lstat(path.Join(dir, strings.ToUpper(path.Base(a))))
			caseInsensitive = err == nil
		},
		func() {
			// mtime: set on the second and third files; read back on the
			// second, and on the third after a RENAME: kept, or the
			// rename's own (a copy). A server that keeps no time as set
			// is taken as one that stamps its own at a rename too
			// (nothing of its times is relied on).
			var setB, setC error
			sideBySide(func() { setB = s.Client.Chtimes(bb, mtimeProbe, mtimeProbe) },
				func() { setC = s.Client.Chtimes(c, mtimeProbe, mtimeProbe) })
			var fi os.FileInfo
			var errB, moved error
			sideBySide(func() {
				if setB == nil {
					fi, errB = s.Lstat(bb)
				}
			}, func() {
				if moved = s.Rename(c, e); moved == nil {
					cNow = e
				}
			})
			if setB != nil || errB != nil {
				return
			}
			switch diff := fi.ModTime().Sub(mtimeProbe).Abs(); {
			case diff == 0:
				mtimeStep = time.Second
			case diff <= 2*time.Second:
				mtimeStep = 2 * time.Second
			default:
				return
			}
			if setC != nil || moved != nil {
				return
			}
			if fi, err := s.Lstat(e); err == nil {
				restamps = fi.ModTime().Sub(mtimeProbe).Abs() > mtimeStep
			}
		},
		func() {
			// an empty directory: still there when its parent is listed
			if err := s.Client.Mkdir(d); err != nil {
				return
			}
			fis, err := s.ReadDir(dir)
			if err != nil {
				return
			}
			for _, fi := range fis {
				if fi.Name() == path.Base(d) && fi.IsDir() {
					emptyDirPersists = true
				}
			}
		},
		func() {
			rp, err := s.Client.RealPath(dir)
			realPath = err == nil && strings.HasPrefix(rp, "/")
		},
		func() {
			if p.StatVFS {
				_, err := s.Client.StatVFS(dir)
				statVFSFails = err != nil
			}
		},
	)
	p.CaseInsensitive, p.MtimeStep, p.RenameRestampsMTime = caseInsensitive, mtimeStep, restamps
	p.EmptyDirPersists, p.RealPath, p.StatVFSFails = emptyDirPersists, realPath, statVFSFails
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}

	if p.PosixRename {
		// what it is for: replacing an existing name (pkg/sftp's request
		// server offers it and, without a handler of its own, makes it a
		// plain RENAME, which refuses)
		p.PosixRenameFails = s.Client.PosixRename(cNow, bb) != nil
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

// sideBySide runs fs at once and returns when all have.
func sideBySide(fs ...func()) {
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Go(f)
	}
	wg.Wait()
}

// MeasureLimits measures the server's limits in processing/<worker>/
// (Profile.MaxRead, Profile.Handles) with a probe file of
// partners.MaxReadProbe bytes of its own, removed after: `intake check`
// runs it when a partner is onboarded; the daemon does not (256 KiB each
// way per partner).
func (s *siteProbes) MeasureLimits(worker string) (maxRead, handles int) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := path.Join(s.Layout.ProcessingDir(worker), partners.ProbePrefix+"r-"+hex.EncodeToString(b[:]))
	defer s.Remove(r)
	maxRead = s.measureRead(r)
	return maxRead, s.measureHandles(r)
}

// measureHandles opens the file p up to partners.MaxHandlesProbe times at
// once (pkg/sftp keeps the OPENs in flight together) and counts the
// handles the server gave, closing each.
func (s *siteProbes) measureHandles(p string) int {
	files := make([]*sftp.File, partners.MaxHandlesProbe)
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

// measureRead writes partners.MaxReadProbe bytes to p and reads them back
// with one READ on the listing channel: the bytes the server answers with
// are the most it serves at once. 0 when the site allows no second channel
// or the read fails.
func (s *siteProbes) measureRead(p string) int {
	f, err := s.Create(p)
	if err != nil {
		return 0
	}
	_, err = f.Write(make([]byte, partners.MaxReadProbe))
	f.Close()
	if err != nil {
		return 0
	}
	c, h, err := s.openListed(p, fxfRead)
	if err != nil {
		return 0
	}
	defer c.closeHandle(h)
	rd, err := c.start(fxpRead, str(h), binary.BigEndian.AppendUint64(nil, 0), u32(partners.MaxReadProbe))
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
// starts at once, up to partners.MaxChannelsProbe: the session's own
// channels, and more opened beside them (each started and its SFTP version
// exchanged, in an op timeout) until the server refuses one; then those
// are closed. `intake check` runs it on a connection of its own (Dial);
// the daemon does not. A refusal may be the channel's open (sshd's
// MaxSessions, ProFTPD's SFTPMaxChannels) or the subsystem's start (a
// server that starts one a connection).
func (s *siteProbes) MeasureChannels() int {
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
		// each on a goroutine of its own: a client's Close waits for the
		// site to end its channel, which a site may never do; the
		// session's Close breaks those channels (they are tracked)
		for _, c := range extra {
			go c.Close()
		}
	}()
	for n < partners.MaxChannelsProbe {
		c, err := inTime(s.Session, func() (*sftp.Client, error) { return s.newSFTP(newWatchdog(s.watch.timeout)) }, func(c *sftp.Client) { c.Close() })
		if err != nil {
			break
		}
		extra = append(extra, c)
		n++
	}
	return n
}
