package spool

import (
	"os"

	"golang.org/x/sys/unix"
)

// openFile opens name as os.OpenFile does and, when direct, has it read
// and written past the page cache (O_DIRECT); it reports whether it is.
// The flag is set once the file is open, so that a filesystem refusing it
// (EINVAL: tmpfs before Linux 6.6, some FUSE) leaves the file open
// through the cache, not created and then failed.
func openFile(name string, flag int, perm os.FileMode, direct bool) (*os.File, bool, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil || !direct {
		return f, false, err
	}
	return f, setFlags(f, unix.O_DIRECT, 0) == nil, nil
}

// setBuffered has f's reads and writes go through the page cache from
// now on.
func setBuffered(f *os.File) error { return setFlags(f, 0, unix.O_DIRECT) }

// setFlags sets and clears f's file status flags (fcntl F_SETFL).
func setFlags(f *os.File, set, clear int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		var fl int
		if fl, serr = unix.FcntlInt(fd, unix.F_GETFL, 0); serr == nil {
			_, serr = unix.FcntlInt(fd, unix.F_SETFL, fl&^clear|set)
		}
	}); err != nil {
		return err
	}
	return serr
}
