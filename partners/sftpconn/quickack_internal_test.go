package sftpconn

import (
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
)

// TestQuickAckUntilTheSessionIsReady: every read that brings bytes sets
// TCP_QUICKACK (an option the kernel must accept) until ready,
// and none after; a connection that is not TCP is left as it is.
func TestQuickAckUntilTheSessionIsReady(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for i := 0; i < 6; i++ {
			c.Write([]byte{byte(i)})
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil {
				return
			}
		}
	}()
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := quickAck(raw)
	defer c.Close()
	q, ok := c.(*quickAckConn)
	if !ok {
		t.Fatalf("a TCP connection was not wrapped: %T", c)
	}
	if runtime.GOOS == "linux" {
		var err error
		q.raw.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1) })
		if err != nil {
			t.Fatalf("the kernel refuses TCP_QUICKACK: %v", err)
		}
	}
	calls := 0
	q.set = func(rc syscall.RawConn) { calls++; setQuickAck(rc) }
	exchange := func() {
		t.Helper()
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(b[:]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		exchange()
	}
	if calls != 3 {
		t.Fatalf("before ready: %d quick ACKs set for 3 reads", calls)
	}
	ready(c)
	for i := 0; i < 3; i++ {
		exchange()
	}
	if calls != 3 {
		t.Fatalf("after ready: %d quick ACKs set in all, want the 3 before it", calls)
	}

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := quickAck(a); got != a {
		t.Fatalf("a pipe was wrapped: %T", got)
	}
	ready(a) // not a quickAckConn: nothing to end
}
