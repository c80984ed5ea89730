package sitefile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Put writes data to dir/name atomically: into a hidden temporary name,
// then renamed over any earlier version (posix-rename). The caller makes
// sure it still holds the file's fencing token right before (the
// pipeline's fileRun.fence): what it writes is the current truth for the
// partner, so it replaces what an earlier attempt or an earlier decision
// wrote. A temporary file left by a kill is removed by the reconciler
// once it is older than reconcile.stale_temp.
func Put(s *sftpconn.Session, dir, name string, data []byte) (string, error) {
	return PutFrom(s, dir, name, bytes.NewReader(data), int64(len(data)), nil)
}

// PutFrom is Put for size bytes read from src (a file in the
// spool's temp area, for a report too large to hold in memory): only a
// file up to WholeMax is read into memory at once, a larger one is copied
// through pkg/sftp. src is read from its start again when the first try
// has to be repeated. fence, when not nil, is the caller's fence, asked
// once the bytes are written and right before the rename that shows
// them: a large file's upload can outlast the fence asked before it. Its
// error leaves nothing on the site.
func PutFrom(s *sftpconn.Session, dir, name string, src io.ReaderAt, size int64, fence func() error) (string, error) {
	st, err := Stage(s, dir, name, size <= WholeMax)
	if err == nil {
		err = st.Write(src, size)
	}
	if s.ListingChannelLost(err) {
		// the listing channel broke under it: once more through pkg/sftp
		if st, err = Stage(s, dir, name, false); err == nil {
			err = st.Write(src, size)
		}
	}
	if err != nil {
		return "", err
	}
	if fence != nil {
		if err := fence(); err != nil {
			st.Discard()
			return "", err
		}
	}
	return st.Publish(path.Join(dir, name))
}

// Staged is Put's temporary file, open, before its bytes are written
// (Stage) and before it is renamed to its final name (Publish). A
// group opens its receipts' temporary files beside its reads and writes
// them beside its archive moves (intake/group_archive.go), so a receipt costs
// the round trips of its close and rename alone; what the partner can see
// is the same as Put's: the final name appears by one rename of a
// complete, closed file.
//
// A small file is opened on the session's listing channel
// (sftpconn.WholeFile), where its bytes and its CLOSE go out together:
// one round trip where pkg/sftp takes two. A large one (a
// rejects report over WholeMax), or one on a site that refuses a second
// channel, goes through pkg/sftp.
type Staged struct {
	s      *sftpconn.Session
	tmp    string
	f      *sftp.File          // pkg/sftp's, or
	w      *sftpconn.WholeFile // the listing channel's
	closed bool                // w's write was tried: its CLOSE sent with it, or the channel gone
}

// WholeMax: a file up to this size is written on the listing channel at
// once (its WRITEs and CLOSE together); a larger one would hold up the
// session's listings behind it and goes through pkg/sftp.
const WholeMax = 256 << 10

// Stage opens a new temporary file in dir for a file to be named
// name; small: its bytes will be at most WholeMax.
func Stage(s *sftpconn.Session, dir, name string, small bool) (*Staged, error) {
	if err := s.EnsureDir(dir); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	tmp := path.Join(dir, TempName(name))
	if small {
		w, err := s.CreateWhole(tmp)
		if err == nil {
			return &Staged{s: s, tmp: tmp, w: w}, nil
		}
		if !errors.Is(err, sftpconn.ErrNoListingChannel) {
			return nil, fmt.Errorf("create %s: %w", tmp, err)
		}
	}
	f, err := s.Create(tmp)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	return &Staged{s: s, tmp: tmp, f: f}, nil
}

// write writes the file's bytes (on the listing channel, and closes it);
// on an error the temporary file is gone.
func (st *Staged) Write(src io.ReaderAt, size int64) error {
	var err error
	if st.w != nil {
		data := make([]byte, size) // at most WholeMax (Stage's small)
		if _, err = src.ReadAt(data, 0); err == io.EOF && size == 0 {
			err = nil
		}
		if err == nil {
			err = st.w.WriteClose(data)
			st.closed = true // its CLOSE went out with the WRITEs, or the channel is gone
		}
	} else {
		var n int64
		// as many WRITEs in flight as the site's round trip needs
		n, err = st.f.ReadFromWithConcurrency(io.NewSectionReader(src, 0, size), st.s.WritesInFlight())
		if err == nil && n != size {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil {
		st.Discard()
		return fmt.Errorf("write %s: %w", st.tmp, err)
	}
	return nil
}

// Discard closes and removes the temporary file (best effort: the
// reconciler removes a temporary file left behind once it is stale). A
// nil st is none: nothing to do.
func (st *Staged) Discard() {
	if st == nil {
		return
	}
	switch {
	case st.w == nil:
		st.f.Close()
	case !st.closed:
		st.w.Close()
	}
	st.s.Remove(st.tmp)
}

// close closes the temporary file, unless write did.
func (st *Staged) close() error {
	if st.w == nil {
		return st.f.Close()
	}
	if st.closed {
		return nil
	}
	st.closed = true
	return st.w.Close()
}

// publish closes the temporary file (unless write did) and renames it
// over dst.
func (st *Staged) Publish(dst string) (string, error) {
	s, tmp := st.s, st.tmp
	if err := st.close(); err != nil {
		s.Remove(tmp)
		return "", fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fault.Check("putfile:before_rename"); err != nil {
		return "", err
	}
	if err := s.PosixRename(tmp, dst); err != nil {
		// a server without posix-rename: replace in two steps
		if _, serr := s.Lstat(dst); serr == nil {
			s.Remove(dst)
		}
		if err := s.Rename(tmp, dst); err != nil {
			s.Remove(tmp)
			return "", fmt.Errorf("publish %s: %w", dst, err)
		}
	}
	return dst, nil
}
