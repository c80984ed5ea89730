// Package opshttp serves the daemon's operational endpoints: /metrics
// (Prometheus, from an injected registry), /healthz (the process is alive)
// and /readyz (the database is reachable, the schema is current, the spool
// is writable; each partner's SFTP state is reported but does not fail
// readiness, since one partner's outage must not take the daemon out).
//
// /readyz answers a client that is not on loopback with its status alone
// (200 "ready" or 503 "unready"): the detailed body names partners, SFTP
// addresses in their errors, held tables and the database's user and name.
// Its checks run at most once per Checks.MaxAge, however many probes
// arrive.
package opshttp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/partner-intake/partner-intake/internal/lifecycle"
)

// DefaultListen is loopback only: metrics are for the local scraper.
const DefaultListen = "127.0.0.1:9464"

// Config of the listener.
type Config struct {
	// Listen is host:port; "" uses DefaultListen, "off" disables.
	Listen string `yaml:"listen"`
}

// Checks are what readiness asks.
type Checks struct {
	// Starting reports what the process still waits for before it serves
	// (the database at start), nil once it runs: readiness fails with it.
	Starting func() error
	Database func(context.Context) error
	Schema   func(context.Context) error
	Spool    func() error
	// Partners reports each partner's SFTP state (informational).
	Partners func() any
	// MaxAge is how long a readiness result answers probes before the
	// checks run again (0: DefaultReadyMaxAge). Probes that arrive while
	// the checks run wait for that run's result.
	MaxAge time.Duration
}

// DefaultReadyMaxAge is how long a readiness result is reused: a flood of
// probes costs one spool write and one database round trip per interval.
const DefaultReadyMaxAge = 2 * time.Second

// Server is the HTTP listener, a lifecycle.Service.
type Server struct {
	life lifecycle.Base
	addr string
	srv  *http.Server
	log  *slog.Logger
	ln   lifecycle.Listener
}

// New builds a server for addr (host:port); Start listens.
func New(addr string, reg prometheus.Gatherer, checks Checks, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogErrorLog{log}}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	ready := &readyCache{checks: checks, maxAge: checks.MaxAge}
	if ready.maxAge <= 0 {
		ready.maxAge = DefaultReadyMaxAge
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		res := ready.get()
		code := http.StatusOK
		if !res.Ready {
			code = http.StatusServiceUnavailable
		}
		if !fromLoopback(r) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(code)
			if res.Ready {
				fmt.Fprintln(w, "ready")
			} else {
				fmt.Fprintln(w, "unready")
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(res)
	})
	return &Server{addr: addr, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, log: log}
}

// readyCache runs the readiness checks at most once per maxAge; callers
// that arrive while they run wait for that run.
type readyCache struct {
	checks Checks
	maxAge time.Duration

	mu  sync.Mutex
	at  time.Time
	res Result
}

func (c *readyCache) get() Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.maxAge {
		return c.res
	}
	// not the request's context: the result serves every probe until it
	// expires, whichever client asked first and went away
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c.res = Readiness(ctx, c.checks)
	c.at = time.Now()
	return c.res
}

// fromLoopback: the request's peer is a loopback address (a reverse proxy
// on the same host counts as loopback; the listener is loopback only by
// default).
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Handler is the server's handler (/metrics, /healthz, /readyz).
func (s *Server) Handler() http.Handler { return s.srv.Handler }

// Result is the body of /readyz.
type Result struct {
	Ready    bool              `json:"ready"`
	Checks   map[string]string `json:"checks"`
	Partners any               `json:"partners,omitempty"`
}

// Readiness runs the checks.
func Readiness(ctx context.Context, c Checks) Result {
	res := Result{Ready: true, Checks: map[string]string{}}
	set := func(name string, err error) {
		if err != nil {
			res.Ready = false
			res.Checks[name] = err.Error()
			return
		}
		res.Checks[name] = "ok"
	}
	if c.Starting != nil {
		set("start", c.Starting())
	}
	if c.Database != nil {
		set("database", c.Database(ctx))
	}
	if c.Schema != nil && res.Checks["database"] == "ok" {
		set("schema", c.Schema(ctx))
	}
	if c.Spool != nil {
		set("spool", c.Spool())
	}
	if c.Partners != nil {
		res.Partners = c.Partners()
	}
	return res
}

// Start listens and serves until Stop (or until ctx ends).
func (s *Server) Start(ctx context.Context) error {
	ctx, err := s.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	if err := s.ln.Serve(ctx, &s.life, s.addr, s.srv, s.log, "http"); err != nil {
		return err
	}
	s.log.Info("serving /metrics, /healthz, /readyz", "addr", s.ln.Addr())
	return nil
}

// Addr is the listening address ("" before Start).
func (s *Server) Addr() string { return s.ln.Addr() }

// Stop shuts the server down, waiting up to 5 s for requests in flight.
// Safe before Start and more than once.
func (s *Server) Stop() { s.life.Stop() }

type slogErrorLog struct{ l *slog.Logger }

func (e slogErrorLog) Println(v ...any) { e.l.Error(fmt.Sprint(v...)) }
