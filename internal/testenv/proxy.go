package testenv

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a loopback TCP proxy that can cut its connections once a given
// number of bytes has flowed from the server to the client: a network
// failure in the middle of a download.
type Proxy struct {
	ln     net.Listener
	target string
	cutAt  atomic.Int64 // 0: never
	down   atomic.Int64 // bytes server -> client
	cuts   atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewProxy listens on a random loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAfter arms a cut after n more bytes from the server (once).
func (p *Proxy) CutAfter(n int64) { p.cutAt.Store(p.down.Load() + n) }

// Cuts is how many times connections were cut.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.ln.Close()
	p.closeAll()
	p.wg.Wait()
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(s, c); s.Close() }()
		go func() { defer p.wg.Done(); p.pump(c, s); c.Close() }()
	}
}

// pump copies server -> client and cuts every connection when armed.
func (p *Proxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			total := p.down.Add(int64(n))
			if at := p.cutAt.Load(); at > 0 && total >= at && p.cutAt.CompareAndSwap(at, 0) {
				p.cuts.Add(1)
				p.closeAll()
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
