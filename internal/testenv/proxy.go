package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a loopback TCP proxy that can cut its connections once a given
// number of bytes has flowed from the server to the client (a network
// failure in the middle of a download), or freeze: keep every connection
// open, accept new ones, and forward nothing either way (a hung site: a
// stuck NAT or server that never answers and never hangs up).
type Proxy struct {
	ln       net.Listener
	target   string
	cutAt    atomic.Int64 // 0: never
	down     atomic.Int64 // bytes server -> client
	cuts     atomic.Int64
	accepted atomic.Int64 // client connections accepted (Accepted)
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
	closed   chan struct{}
	once     sync.Once

	frozeMu sync.Mutex
	frozen  chan struct{} // non-nil while frozen; closed by Thaw
}

// NewProxy listens on a random loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAfter arms a cut after n more bytes from the server (once).
func (p *Proxy) CutAfter(n int64) { p.cutAt.Store(p.down.Load() + n) }

// Freeze stops forwarding: bytes already read are held, connections stay
// open, new ones are accepted but reach nothing until Thaw.
func (p *Proxy) Freeze() {
	p.frozeMu.Lock()
	defer p.frozeMu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Thaw forwards again, held bytes first.
func (p *Proxy) Thaw() {
	p.frozeMu.Lock()
	defer p.frozeMu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// hold waits while the proxy is frozen (or until it closes).
func (p *Proxy) hold(done <-chan struct{}) {
	p.frozeMu.Lock()
	f := p.frozen
	p.frozeMu.Unlock()
	if f == nil {
		return
	}
	select {
	case <-f:
	case <-done:
	}
}

// Cuts is how many times connections were cut.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Accepted is how many client connections the proxy accepted (a frozen
// proxy accepts them and holds them): a test waits on it to know a dial
// is under way.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.once.Do(func() { close(p.closed) })
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
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.accepted.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.hold(p.closed) // a frozen proxy does not even reach the server
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, s)
			p.mu.Unlock()
			select {
			case <-p.closed: // Close ran meanwhile and missed s
				s.Close()
				c.Close()
				return
			default:
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.relay(s, c, false); s.Close() }()
			p.relay(c, s, true)
			c.Close()
		}()
	}
}

// cut counts n bytes sent down and, once the armed count is reached,
// cuts every connection (true).
func (p *Proxy) cut(n int64) bool {
	total := p.down.Add(n)
	if at := p.cutAt.Load(); at > 0 && total >= at && p.cutAt.CompareAndSwap(at, 0) {
		p.cuts.Add(1)
		p.closeAll()
		return true
	}
	return false
}

// relay copies src to dst, holding while frozen; down (server ->
// client) counts the bytes and cuts every connection when armed.
func (p *Proxy) relay(dst, src net.Conn, down bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.hold(p.closed)
			if down && p.cut(int64(n)) {
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
