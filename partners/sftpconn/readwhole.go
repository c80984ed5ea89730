package sftpconn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path"
)

// A small file read whole on the session's listing channel: once its OPEN
// is answered, an FSTAT, the READs that cover the bytes wanted and the
// CLOSE go out together, two round trips in all. Through pkg/sftp a
// manifest took four: OPEN, READ, the READ that finds its end, and CLOSE
// (docs/performance.md).

// SFTP v3 requests a whole read sends.
const (
	fxpRead  = 5
	fxpLstat = 7
	fxpFstat = 8
	fxpData  = 103

	fxfRead = 0x01
)

// errPartRead: the site answered a READ with fewer bytes than the file
// holds (SFTP allows a short read): the caller reads it the usual way.
var errPartRead = errors.New("sftp: a short read of a small file")

// ErrNotRegular: the path is not a regular file (a symlink swapped in, a
// directory, a FIFO): it is not read.
var ErrNotRegular = errors.New("not a regular file")

// wholeFiles moves small files whole on the listing channel: a file read
// in two round trips, a manifest read so, a file written with its bytes
// and CLOSE in one.
type wholeFiles struct{ *Session }

// ReadWhole reads the file at p on the listing channel, at most limit
// bytes from its start: the whole file when it holds no more. It fails
// with ErrNoListingChannel on a site that refuses a second channel and
// with errPartRead when the site's replies do not add up to the file's
// bytes; ListingChannelLost tells the channel's own failure from the
// site's answer.
func (s *wholeFiles) ReadWhole(p string, limit int) ([]byte, error) {
	c, h, err := s.openListed(p, fxfRead)
	if err != nil {
		return nil, err
	}
	// FSTAT, an LSTAT of the path, the READs and the CLOSE together; the
	// CLOSE's reply is not waited for (closeHandle). The OPEN follows a
	// symlink; the LSTAT does not: a path that is not a regular file, or
	// not the file opened, is refused, its bytes unused.
	stat, err := c.start(fxpFstat, str(h))
	if err != nil {
		return nil, s.Deadline(err)
	}
	lstat, err := c.start(fxpLstat, str(p))
	if err != nil {
		return nil, s.Deadline(err)
	}
	var reads []<-chan reply
	for off := 0; off < limit && err == nil; off += wholeChunk {
		var rd <-chan reply
		n := min(wholeChunk, limit-off)
		rd, err = c.start(fxpRead, str(h), binary.BigEndian.AppendUint64(nil, uint64(off)), u32(uint32(n)))
		if err == nil {
			reads = append(reads, rd)
		}
	}
	if err != nil {
		return nil, s.Deadline(err)
	}
	c.closeHandle(h)
	size, err := s.fstatSize(c, <-stat)
	if lerr := s.lstatRegular(c, <-lstat, p, size); err == nil {
		err = lerr
	}
	var data []byte
	end := false // a READ found the file's end (or a short one came)
	for i, rd := range reads {
		rep := <-rd
		if err != nil {
			continue // every reply is read, so none is left behind
		}
		switch {
		case rep.err != nil:
			err = s.Deadline(rep.err)
		case rep.typ == fxpStatus:
			if st := (decoder{b: rep.body}); st.u32() != fxStatusEOF {
				err = fmt.Errorf("read %s: %w", p, statusError(rep.typ, rep.body))
			}
			end = true
		case rep.typ == fxpData:
			d := decoder{b: rep.body}
			b := d.str()
			switch {
			case d.err != nil:
				c.fail(d.err)
				err = c.broken()
			case end || len(data) != i*wholeChunk:
				err = errPartRead // bytes after a short READ or the end
			default:
				data = append(data, b...)
				end = len(b) < wholeChunk
			}
		default:
			err = c.unexpected("read", rep.typ)
		}
	}
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != min(size, int64(limit)) {
		return nil, errPartRead
	}
	return data, nil
}

// fstatSize is the size an FSTAT's reply states; errPartRead when it
// states none.
func (s *wholeFiles) fstatSize(c *rawSFTP, rep reply) (int64, error) {
	if rep.err != nil {
		return 0, s.Deadline(rep.err)
	}
	switch rep.typ {
	case fxpAttrs:
	case fxpStatus:
		return 0, errPartRead // a site without FSTAT: read the usual way
	default:
		return 0, c.unexpected("fstat", rep.typ)
	}
	d := decoder{b: rep.body}
	if flags := d.u32(); d.err == nil && flags&attrSize == 0 {
		return 0, errPartRead
	}
	size := d.u64()
	if d.err != nil {
		c.fail(d.err)
		return 0, c.broken()
	}
	return int64(size), nil
}

// lstatRegular checks an LSTAT's reply: the path is no symlink, and a
// regular file there has the size the opened file has (ErrNotRegular
// otherwise: the OPEN followed a link to bytes that are not the path's).
func (s *wholeFiles) lstatRegular(c *rawSFTP, rep reply, p string, size int64) error {
	if rep.err != nil {
		return s.Deadline(rep.err)
	}
	switch rep.typ {
	case fxpAttrs:
	case fxpStatus:
		return fmt.Errorf("lstat %s: %w", p, statusError(rep.typ, rep.body))
	default:
		return c.unexpected("lstat", rep.typ)
	}
	d := decoder{b: rep.body}
	fi := d.attrs(path.Base(p))
	if d.err != nil {
		c.fail(d.err)
		return c.broken()
	}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s: %w (a symlink)", p, ErrNotRegular)
	case fi.Mode().IsRegular() && fi.Size() != size:
		return fmt.Errorf("%s: %w (not the file opened: another was swapped in)", p, ErrNotRegular)
	}
	// a directory or another entry the OPEN reached itself: its READ
	// fails, as the site's error
	return nil
}
