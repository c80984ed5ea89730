//go:build !linux

package sftpconn

import "syscall"

// setQuickAck: TCP_QUICKACK is Linux's; elsewhere the kernel's delayed
// ACKs stay.
func setQuickAck(syscall.RawConn) {}
