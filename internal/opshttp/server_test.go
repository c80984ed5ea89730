package opshttp_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

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
