package sftpconn

import (
	"cmp"
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
// removed after: five files, two or three of them written, one renamed
// onto another with posix-rename, then one onto the same with RENAME; a
// directory left empty; the time set on two files, one of them renamed;
// a file's name in upper case; REALPATH and statvfs of the directory;
// fsync of a file's handle. The extensions are the server's own list,
// each used (but hardlink) to see that it works. Nothing is written
// outside the scratch directory and nothing of the partner's is touched.
//
// The probes go out as chains side by side, each on names of its own, so
// the measure costs the round trips of its longest chain and the
// removals (six on OpenSSH), not of every request one after another
// (about thirty: 1.6 s at 50 ms):
//   - times: two empty files made (OPEN, CLOSE), their times set at
//     once, then the first read back beside the second's RENAME, then
//     the renamed one read back (five); the name's case is looked up on
//     the first once it is made;
//   - renames: three files made at once, one synced (OPEN, fsync, CLOSE;
//     written where fsync is not offered), two written (OPEN, WRITE,
//     CLOSE), then posix-rename of one written onto the other, then
//     RENAME of the synced one onto that same name (five; each finds the
//     name there, whatever the other did);
//   - the empty directory made, then its parent listed;
//   - REALPATH; statvfs.
//
// At most five files of the probe are open at once. A server that bounds
// a session's open files below that refuses an OPEN: refused so, the
// measure runs again one probe after another, one file open at a time
// (about thirty round trips, on such a server alone).
func (s *siteProbes) MeasureProfile(worker string) (partners.Profile, error) {
	p, err := s.measureProfile(worker, sideBySide, true)
	if err != nil && IsRefused(err) && !s.TimedOut() {
		p, err = s.measureProfile(worker, oneByOne, false)
	}
	return p, err
}

// measureProfile is MeasureProfile's probes, their chains run by run:
// side by side, or one after another. strict: a refused listing of the
// scratch directory (an OPENDIR past the server's bound on a session's
// handles, while files are open beside it) fails the measure rather than
// being taken for a server that keeps no empty directory.
func (s *siteProbes) measureProfile(worker string, sideBySide func(...func()), strict bool) (partners.Profile, error) {
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
	name := func(n string) string { return path.Join(dir, partners.ProbePrefix+n+"-"+tag) }
	// times: bb read back, c renamed to e; renames: g posix-renamed onto
	// f, then a (synced) RENAMEd onto f; d the empty directory
	a, bb, c, d, e, f, g := name("a"), name("b"), name("c"), name("d"), name("e"), name("f"), name("g")
	defer sideBySide(func() { s.Remove(a) }, func() { s.Remove(bb) }, func() { s.Remove(c) },
		func() { s.Remove(e) }, func() { s.Remove(f) }, func() { s.Remove(g) }, func() { s.RemoveDirectory(d) })

	// touch creates name and, as told, writes its name into it or
	// fsyncs its handle (fsync@openssh.com: an error is an extension
	// offered that does not work); pkg/sftp sends a handle's requests one
	// after another, so each is one round trip more
	var fsyncFails bool
	const (
		empty = iota
		written
		synced
	)
	touch := func(name string, how int) error {
		f, err := s.Create(name)
		if err != nil {
			return fmt.Errorf("%s is not writable: %w", dir, s.Deadline(err))
		}
		switch how {
		case written:
			_, err = f.Write([]byte(name))
		case synced:
			fsyncFails = f.Sync() != nil
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("write in %s: %w", dir, s.Deadline(err))
		}
		return nil
	}
	var timesErr, renamesErr, listErr error
	var caseInsensitive, emptyDirPersists, realPath, statVFSFails bool
	var mtimeStep time.Duration
	restamps := true
	var posixFails, overwrites bool
	sideBySide(
		func() {
			// times: set on bb and c; read back on bb, and on c after a
			// RENAME: kept, or the rename's own (a copy). A server that
			// keeps no time as set is taken as one that stamps its own at
			// a rename too (nothing of its times is relied on).
			var errs [2]error
			sideBySide(func() { errs[0] = touch(bb, empty) }, func() { errs[1] = touch(c, empty) })
			if timesErr = cmp.Or(errs[:]...); timesErr != nil {
				return
			}
			var setB, setC error
			sideBySide(
				func() {
					// names: bb under its name in upper case (the tag's
					// hex letters and the prefix change; a case-sensitive
					// server has no such file)
					_, err := s.Lstat(path.Join(dir, strings.ToUpper(path.Base(bb))))
					caseInsensitive = err == nil
				},
				func() { setB = s.Client.Chtimes(bb, mtimeProbe, mtimeProbe) },
				func() { setC = s.Client.Chtimes(c, mtimeProbe, mtimeProbe) })
			var fi os.FileInfo
			var errB, moved error
			sideBySide(func() {
				if setB == nil {
					fi, errB = s.Lstat(bb)
				}
			}, func() { moved = s.Rename(c, e) })
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
			var errs [3]error
			sync := written
			if p.Fsync {
				sync = synced
			}
			// f and g written: within the synced file's three round trips
			sideBySide(func() { errs[0] = touch(a, sync) }, func() { errs[1] = touch(f, written) },
				func() { errs[2] = touch(g, written) })
			if renamesErr = cmp.Or(errs[:]...); renamesErr != nil {
				return
			}
			if p.PosixRename {
				// what it is for: replacing an existing name (pkg/sftp's
				// request server offers it and, without a handler of its
				// own, makes it a plain RENAME, which refuses)
				posixFails = s.Client.PosixRename(g, f) != nil
			}
			// f is there whether or not g replaced it
			overwrites = s.Rename(a, f) == nil
		},
		func() {
			// an empty directory: still there when its parent is listed
			if err := s.Client.Mkdir(d); err != nil {
				return
			}
			fis, err := s.ReadDir(dir)
			if err != nil {
				listErr = err
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
	if timesErr != nil {
		return p, timesErr
	}
	if renamesErr != nil {
		return p, renamesErr
	}
	if strict && IsRefused(listErr) {
		return p, fmt.Errorf("list %s: %w", dir, s.Deadline(listErr))
	}
	if s.TimedOut() {
		return p, s.Deadline(os.ErrDeadlineExceeded)
	}
	p.FsyncFails = fsyncFails
	p.CaseInsensitive, p.MtimeStep, p.RenameRestampsMTime = caseInsensitive, mtimeStep, restamps
	p.EmptyDirPersists, p.RealPath, p.StatVFSFails = emptyDirPersists, realPath, statVFSFails
	p.PosixRenameFails, p.RenameOverwrites = posixFails, overwrites
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

// oneByOne runs fs one after another.
func oneByOne(fs ...func()) {
	for _, f := range fs {
		f()
	}
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
