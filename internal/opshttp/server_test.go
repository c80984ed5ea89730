package opshttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/partner-intake/partner-intake/internal/opshttp"
	"github.com/partner-intake/partner-intake/internal/pgtemp"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/spool"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestReadyzFailsWhilePostgresIsDown(t *testing.T) {
	pg, err := pgtemp.Start(pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	ctx := context.Background()
	url, err := pg.CreateDB(ctx, "ready")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sp, _ := spool.New(t.TempDir())
	reg := prometheus.NewRegistry()
	promauto.With(reg).NewCounter(prometheus.CounterOpts{Name: "intake_test_total", Help: "t"}).Inc()
	srv := opshttp.New("127.0.0.1:0", reg, opshttp.Checks{
		Database: func(ctx context.Context) error { return pool.Ping(ctx) },
		Schema:   func(ctx context.Context) error { return migrations.Current(ctx, pool) },
		Spool:    sp.Probe,
		Partners: func() any { return map[string]string{"acme": "down"} },
		MaxAge:   time.Nanosecond, // each probe below asks anew
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	base := "http://" + srv.Addr()

	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz %d %s", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "intake_test_total 1") {
		t.Fatalf("metrics %d %s", code, body)
	}
	code, body := get(t, base+"/readyz")
	if code != 503 || !strings.Contains(body, "intake migrate") {
		t.Fatalf("readyz before migrations: %d %s", code, body)
	}
	if _, err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	code, body = get(t, base+"/readyz")
	var res opshttp.Result
	json.Unmarshal([]byte(body), &res)
	if code != 200 || !res.Ready || res.Checks["database"] != "ok" || res.Checks["spool"] != "ok" {
		t.Fatalf("readyz: %d %s", code, body)
	}
	if !strings.Contains(body, `"acme":"down"`) {
		t.Fatalf("partner state missing from %s (it is reported but does not fail readiness)", body)
	}
	if err := pg.StopServer("fast"); err != nil {
		t.Fatal(err)
	}
	code, body = get(t, base+"/readyz")
	json.Unmarshal([]byte(body), &res)
	if code != 503 || res.Ready || res.Checks["database"] == "ok" {
		t.Fatalf("readyz with PostgreSQL stopped: %d %s", code, body)
	}
	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after restart: %d %s", code, body)
	}
}

// /readyz tells a client that is not on loopback its status alone: no
// partner, SFTP address, database user or name; loopback gets the detail.
func TestReadyzTellsOnlyLoopbackItsDetail(t *testing.T) {
	var fail atomic.Bool
	srv := opshttp.New("127.0.0.1:0", prometheus.NewRegistry(), opshttp.Checks{
		Database: func(context.Context) error {
			if fail.Load() {
				return errors.New(`failed to connect to user=intake database=intake_prod`)
			}
			return nil
		},
		Partners: func() any { return map[string]string{"acme": "dial tcp sftp.acme.example:22: connection refused"} },
		MaxAge:   time.Nanosecond,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	probe := func(remote string) (int, string) {
		req := httptest.NewRequest("GET", "/readyz", nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, remote := range []string{"203.0.113.7:40000", "[2001:db8::7]:40000", "10.0.0.1:1"} {
		if code, body := probe(remote); code != 200 || body != "ready\n" {
			t.Fatalf("readyz from %s: %d %q, want 200 \"ready\" alone", remote, code, body)
		}
	}
	for _, remote := range []string{"127.0.0.1:40000", "[::1]:40000"} {
		if code, body := probe(remote); code != 200 || !strings.Contains(body, "sftp.acme.example") {
			t.Fatalf("readyz from %s: %d %q, want the detail", remote, code, body)
		}
	}
	fail.Store(true)
	if code, body := probe("203.0.113.7:40000"); code != 503 || body != "unready\n" {
		t.Fatalf("readyz from afar with the database down: %d %q, want 503 \"unready\" alone", code, body)
	}
	if code, body := probe("127.0.0.1:40000"); code != 503 || !strings.Contains(body, "intake_prod") {
		t.Fatalf("readyz from loopback with the database down: %d %q, want the detail", code, body)
	}
}

// A flood of /readyz probes runs the checks once per MaxAge: probes
// that arrive while they run wait for that run's result.
func TestReadyzRunsItsChecksOncePerInterval(t *testing.T) {
	var spools, pings, started atomic.Int64
	// the database check runs until every probe has arrived: they all
	// meet a run in flight
	srv := opshttp.New("127.0.0.1:0", prometheus.NewRegistry(), opshttp.Checks{
		Database: func(context.Context) error {
			pings.Add(1)
			deadline := time.Now().Add(10 * time.Second)
			for tick := time.NewTicker(time.Millisecond); started.Load() < 200 && time.Now().Before(deadline); <-tick.C {
			}
			return nil
		},
		Spool:  func() error { spools.Add(1); return nil },
		MaxAge: time.Hour,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started.Add(1)
			req := httptest.NewRequest("GET", "/readyz", nil)
			req.RemoteAddr = "127.0.0.1:1"
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, req)
			if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"ready":true`) {
				bad.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of 200 probes were not answered ready", bad.Load())
	}
	if pings.Load() != 1 || spools.Load() != 1 {
		t.Fatalf("200 probes ran the database check %d times and the spool check %d times, want once each", pings.Load(), spools.Load())
	}
}
