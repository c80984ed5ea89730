package sftpconn

import (
	"net"
	"sync/atomic"
	"syscall"
)

// quickAckConn acknowledges every segment the site sends at once while a
// session is being set up, instead of after the kernel's delayed-ACK
// timer (40 ms on Linux).
//
// Why: until a session's first channel starts its subsystem, OpenSSH's
// sshd leaves Nagle's algorithm on (it sets TCP_NODELAY only then). Right
// after the login it writes two packets of its own (host keys, ext-info),
// and its confirmation of our channel open is held behind them until we
// acknowledge them; we had nothing else to send, so the acknowledgement
// waited for the timer. Measured on loopback (docs/performance.md): the
// channel open took 47 ms, 5.8 ms with this, and a login with
// its channel 112 ms, 71 ms with this. Over a long link the stall is the
// timer on top of a round trip.
//
// Linux clears TCP_QUICKACK again on its own, so it is set after every
// read until ready is called: once the session is up sshd has TCP_NODELAY
// and the bulk transfers that follow keep the kernel's delayed ACKs
// (fewer packets, no syscall per read).
type quickAckConn struct {
	net.Conn
	raw  syscall.RawConn
	set  func(syscall.RawConn) // setQuickAck; a test counts the calls
	done atomic.Bool
}

// quickAck wraps a TCP connection; any other connection is returned as is.
func quickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &quickAckConn{Conn: c, raw: raw, set: setQuickAck}
}

func (q *quickAckConn) Read(b []byte) (int, error) {
	n, err := q.Conn.Read(b)
	if n > 0 && !q.done.Load() {
		q.set(q.raw)
	}
	return n, err
}

// ready ends the quick acknowledgements of c if it is a quickAckConn.
func ready(c net.Conn) {
	if q, ok := c.(*quickAckConn); ok {
		q.done.Store(true)
	}
}
