package bench

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// wanProxy is a loopback TCP proxy that delays every byte by a fixed time
// in each direction (25 ms each way: a 50 ms round trip), without limiting
// throughput: each read is stamped and written out once its delay has
// passed, so many requests in flight overlap as on a long link. The
// database stays local; only SFTP goes through it.
type wanProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	// turns counts, over all connections, the round trips paid one
	// after another: a client send that follows a reply from the server
	// and comes at least one round trip after the last one counted on its
	// connection. Requests that go out together, or one after another as
	// the replies of one burst come in, count once; a transfer that keeps
	// requests in flight counts once per round trip it lasts. Summed over
	// connections, so partners served at once add up.
	turns atomic.Int64
}

// Turns is the number of sequential round trips so far (see turns).
func (p *wanProxy) Turns() int64 { return p.turns.Load() }

func newWANProxy(target string, oneWay time.Duration) (*wanProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &wanProxy{ln: ln, target: target, delay: oneWay}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *wanProxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy and every connection through it.
func (p *wanProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *wanProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *wanProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			// the TCP handshake to the far end costs a round trip too
			time.Sleep(2 * p.delay)
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.track(s)
			var replied atomic.Bool // the server wrote since the client last sent
			var last time.Time      // the last counted turn (client reader only)
			var both sync.WaitGroup
			both.Add(2)
			go func() {
				defer both.Done()
				p.pipe(s, c, func() {
					if replied.Swap(false) && time.Since(last) >= 2*p.delay*9/10 {
						last = time.Now()
						p.turns.Add(1)
					}
				})
			}()
			go func() { defer both.Done(); p.pipe(c, s, func() { replied.Store(true) }) }()
			both.Wait()
		}()
	}
}

type stamped struct {
	b   []byte
	buf *[]byte // the pooled buffer b is in, back to proxyBufs once written
	due time.Time
}

// proxyBufs are the proxy's read buffers, reused: a fresh 64 KiB per read
// cost the bench process about a core's worth of allocation and GC
// during the 1M-row download, CPU that a real link does not take from
// the daemon and PostgreSQL on a two-core machine.
var proxyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// pipe copies src to dst, each read delivered p.delay after it arrived.
// The queue is bounded (a window of 1024 reads of up to 64 KiB); a full
// queue stops reading, as a full TCP window would.
func (p *wanProxy) pipe(dst, src net.Conn, onRead func()) {
	q := make(chan stamped, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range q {
			if d := time.Until(m.due); d > 0 {
				time.Sleep(d)
			}
			_, err := dst.Write(m.b)
			proxyBufs.Put(m.buf)
			if err != nil {
				src.Close()
				for range q {
				}
				return
			}
		}
		// half-close as the source did, so the far end sees EOF
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	for {
		buf := proxyBufs.Get().(*[]byte)
		n, err := src.Read(*buf)
		if n > 0 {
			onRead()
			q <- stamped{b: (*buf)[:n], buf: buf, due: time.Now().Add(p.delay)}
		} else {
			proxyBufs.Put(buf)
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}
