package sftpconn

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A small file written whole on the session's listing channel (ListDir's,
// listdir.go): opened ahead, then its bytes and its CLOSE sent together
// and answered in one round trip. pkg/sftp takes two for the same,
// since its File.Close waits for a write under way (it holds the file's
// lock). intake writes its receipts and reason files this way, into a
// temporary name it then renames: the rename is sent only once the WRITE
// and the CLOSE were both answered, so what a partner can see is as
// complete and closed as before (docs/performance.md).

// ErrNoListingChannel: the site refuses a second channel; the caller
// writes through pkg/sftp.
var ErrNoListingChannel = errors.New("sftp: the site refuses a listing channel")

// ListingChannelLost reports whether err is the listing channel's own
// failure (a reply that broke it, the channel dropped or ended), not the
// site's answer to the request, on a session that goes on: the same step
// through pkg/sftp can still succeed. On a session closed (by its
// watchdog, a shutdown) or whose connection ended it cannot.
func (s *wholeFiles) ListingChannelLost(err error) bool {
	if !channelFailure(err) {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
	}
	return !s.conn.dead()
}

// channelFailure: err is the listing channel's own failure.
func channelFailure(err error) bool {
	return errors.Is(err, errBrokenChannel) || errors.Is(err, errChannelDropped)
}

// WholeFile is a file opened for writing on the listing channel.
type WholeFile struct {
	s      *Session
	c      *rawSFTP
	handle string
	path   string
}

// SFTP v3 OPEN flags and the requests a WholeFile sends.
const (
	fxpOpen  = 3
	fxpWrite = 6

	fxfWrite = 0x02
	fxfCreat = 0x08
	fxfTrunc = 0x10

	fxOK = 0

	// wholeChunk is one WRITE's bytes: every server takes 32 KiB.
	wholeChunk = 32 << 10
)

// CreateWhole creates (or truncates) p for writing on the listing
// channel, under the session's deadline, once the session is prepared.
func (s *wholeFiles) CreateWhole(p string) (*WholeFile, error) {
	if err := s.Prepared(); err != nil {
		return nil, err
	}
	c, h, err := s.openListed(p, fxfWrite|fxfCreat|fxfTrunc)
	if err != nil {
		return nil, err
	}
	return &WholeFile{s: s.Session, c: c, handle: h, path: p}, nil
}

// openListed opens p on the listing channel with the SFTP OPEN flags
// given, under the session's deadline, and returns the channel and the
// file's handle.
func (s *wholeFiles) openListed(p string, flags uint32) (*rawSFTP, string, error) {
	c := s.listChannel()
	if c == nil {
		return nil, "", ErrNoListingChannel
	}
	r, err := c.start(fxpOpen, str(p), u32(flags), u32(0))
	if err != nil {
		return nil, "", s.Deadline(err)
	}
	rep := <-r
	if rep.err != nil {
		return nil, "", s.Deadline(rep.err)
	}
	switch rep.typ {
	case fxpHandle:
	case fxpStatus:
		return nil, "", fmt.Errorf("open %s: %w", p, statusError(rep.typ, rep.body))
	default:
		return nil, "", c.unexpected("open", rep.typ)
	}
	d := decoder{b: rep.body}
	h := d.str()
	if d.err != nil {
		c.fail(d.err)
		return nil, "", c.broken()
	}
	return c, h, nil
}

// WriteClose writes data from the file's start and closes it: every
// WRITE and the CLOSE go out together, and it returns once all are
// answered, with the first failure. The file is closed either way (a
// CLOSE after a failed WRITE still releases the handle).
func (f *WholeFile) WriteClose(data []byte) error {
	var replies []<-chan reply
	var err error
	for off := 0; off < len(data) && err == nil; off += wholeChunk {
		var r <-chan reply
		chunk := data[off:min(off+wholeChunk, len(data))]
		r, err = f.c.start(fxpWrite, str(f.handle), binary.BigEndian.AppendUint64(nil, uint64(off)), u32(uint32(len(chunk))), chunk)
		if err == nil {
			replies = append(replies, r)
		}
	}
	closing := err == nil
	if closing {
		var r <-chan reply
		if r, err = f.c.start(fxpClose, str(f.handle)); err == nil {
			replies = append(replies, r)
		}
	}
	if err != nil {
		err = f.s.Deadline(err)
	}
	for i, r := range replies {
		what := "write"
		if closing && i == len(replies)-1 {
			what = "close"
		}
		if rerr := f.status(what, <-r); err == nil {
			err = rerr
		}
	}
	return err
}

// Close closes the file unwritten (one given up).
func (f *WholeFile) Close() error {
	r, err := f.c.start(fxpClose, str(f.handle))
	if err != nil {
		return f.s.Deadline(err)
	}
	return f.status("close", <-r)
}

// status is a WRITE's or CLOSE's outcome.
func (f *WholeFile) status(what string, rep reply) error {
	if rep.err != nil {
		return f.s.Deadline(rep.err)
	}
	if rep.typ != fxpStatus {
		return f.c.unexpected(what, rep.typ)
	}
	d := decoder{b: rep.body}
	code := d.u32()
	if d.err != nil {
		f.c.fail(d.err) // a status without its code: a broken stream
		return fmt.Errorf("%s %s: %w: %w", what, f.path, errBrokenChannel, d.err)
	}
	if code == fxOK {
		return nil
	}
	return fmt.Errorf("%s %s: %w", what, f.path, statusError(rep.typ, rep.body))
}
