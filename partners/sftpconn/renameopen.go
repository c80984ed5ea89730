package sftpconn

import (
	"bytes"
	"encoding/binary"
	"os"

	"github.com/pkg/sftp"
)

// Opening is a file opened right behind the RENAME that put it in place
// (RenameAndOpen): its OPEN and an LSTAT of its path, answered after the
// RENAME's.
type Opening struct {
	done chan struct{}
	f    *sftp.File
	fi   os.FileInfo
	err  error
}

// Wait returns the file opened and the LSTAT of its path, or why either
// failed (under the session's deadline). The file is the caller's to
// close. The LSTAT is of the path itself: a symbolic link the RENAME put
// there shows as one (the OPEN followed it), which the caller refuses.
func (o *Opening) Wait() (*sftp.File, os.FileInfo, error) {
	<-o.done
	return o.f, o.fi, o.err
}

// Discard closes the file once it is opened, without waiting: it was not
// used.
func (o *Opening) Discard() {
	go func() {
		if f, _, err := o.Wait(); err == nil {
			f.Close()
		}
	}()
}

// renamePolicy holds what a RENAME does on this site (whether it
// overwrites, whether empty directories vanish) and the claim's rename
// with the file opened behind it.
type renamePolicy struct{ *Session }

// RenameAndOpen is Rename, with an OPEN and an LSTAT of to sent right
// behind the RENAME on the same channel, before its answer: one round
// trip for the three where a rename and then an open took two (a claim,
// then its download: docs/performance.md). The site answers a
// channel's requests in the order they came (OpenSSH's sftp-server, as
// ListDir and Prepare rely on too), so both name what the RENAME put at
// to. The order on the wire is made sure of, not assumed: pkg/sftp writes
// its requests one at a time, a RENAME in one Write, and the OPEN and
// LSTAT are started only once the channel's writer has passed this very
// RENAME on (watchdog.awaitSent). When the rename fails, whatever the OPEN opened
// is closed and the error is the rename's.
//
// Unlike the round trips saved elsewhere, this one rests on the order for
// correctness (an OPEN answered before the RENAME, on a server whose
// RENAME replaces a file, would open what was at to before), so it is
// taken only where the server says it is OpenSSH, whose sftp-server
// answers a channel's requests one at a time in order by design
// (inOrder). Elsewhere the file is renamed, and nil is returned: the
// caller opens it after.
func (s *renamePolicy) RenameAndOpen(from, to string) (*Opening, error) {
	if err := s.Prepared(); err != nil {
		return nil, err
	}
	if err := s.clobberCheck(to); err != nil {
		return nil, err
	}
	if !s.inOrder() {
		return nil, s.Deadline(s.Client.Rename(from, to))
	}
	sent, cancel := s.watch.awaitSent(renamePacket(from, to))
	renamed := make(chan error, 1)
	go func() { renamed <- s.Client.Rename(from, to) }()
	var err error
	ended := false
	select {
	case <-sent:
	case err = <-renamed:
		// ended before its write was seen: it failed before that (a
		// closed session), or its answer came back before the writer's
		// report (a near site); either way the file is opened after it
		cancel()
		ended = true
		if err != nil {
			return nil, s.Deadline(err)
		}
	}
	o := &Opening{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		stat := make(chan error, 1)
		go func() {
			var err error
			o.fi, err = s.Client.Lstat(to)
			_, err = sized(to, o.fi, err)
			stat <- err
		}()
		f, err := s.Client.Open(to)
		serr := <-stat
		switch {
		case err != nil:
			o.err = s.Deadline(err)
		case serr != nil:
			f.Close()
			o.err = s.Deadline(serr)
		default:
			o.f = f
		}
	}()
	if !ended {
		err = <-renamed
	}
	if err != nil {
		o.Discard()
		return nil, s.Deadline(err)
	}
	return o, nil
}

// inOrder reports whether the site's server answers a channel's requests
// one at a time, in order (sshConn.openSSH).
func (s *renamePolicy) inOrder() bool { return s.conn.openSSH() }

// renamePacket matches pkg/sftp's SSH_FXP_RENAME of from to to as the
// channel's writer passes it on: the packet whole, whatever its id.
func renamePacket(from, to string) func([]byte) bool {
	var want []byte
	for _, p := range []string{from, to} {
		want = binary.BigEndian.AppendUint32(want, uint32(len(p)))
		want = append(want, p...)
	}
	return func(b []byte) bool {
		// length, type, id, then the two paths
		return len(b) == 9+len(want) && b[4] == fxpRename && bytes.Equal(b[9:], want)
	}
}
