//go:build !linux

package spool

import "os"

// openFile opens name as os.OpenFile does: past the page cache only on
// Linux.
func openFile(name string, flag int, perm os.FileMode, _ bool) (*os.File, bool, error) {
	f, err := os.OpenFile(name, flag, perm)
	return f, false, err
}

func setBuffered(*os.File) error { return nil }
