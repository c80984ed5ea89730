package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Listener is where a Service serves HTTP (the ops listener, the review
// console): Serve listens and serves on the Service's Base until its
// context ends; Addr is the address it listens on.
type Listener struct {
	mu sync.Mutex
	ln net.Listener
}

// Serve listens on addr and serves srv on b's goroutines until ctx (b's
// context) ends, then gives the requests in flight up to 5 s. name names
// the server in its errors and log lines ("http", "console"); a listen
// error aborts b's start.
func (l *Listener) Serve(ctx context.Context, b *Base, addr string, srv *http.Server, log *slog.Logger, name string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return b.Abort(fmt.Errorf("%s listen %s: %w", name, addr, err))
	}
	l.mu.Lock()
	l.ln = ln
	l.mu.Unlock()
	b.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(name+" server", "err", err)
		}
	})
	b.Go(func() {
		<-ctx.Done()
		// requests in flight get up to 5 s
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	})
	return nil
}

// Addr is the listener's address once Serve listens ("" before).
func (l *Listener) Addr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln == nil {
		return ""
	}
	return l.ln.Addr().String()
}
