//go:build !linux

package partners

import "syscall"

// setQuickAck: TCP_QUICKACK is Linux's; elsewhere the kernel's delayed
// ACKs stay.
func setQuickAck(syscall.RawConn) {}
