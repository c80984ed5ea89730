package main

import (
	"io"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// metricNames records the metric names collectors describe when registered.
type metricNames struct {
	prometheus.Registerer
	seen map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (n *metricNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			n.seen[m[1]] = true
		}
	}
	return n.Registerer.Register(c)
}

func (n *metricNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := n.Register(c); err != nil {
			panic(err)
		}
	}
}

// The alert rules and the dashboard may only use metrics the daemon
// exports: a renamed metric must not silently disable an alert.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	cfg, err := config.Load("../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg := &metricNames{Registerer: prometheus.NewRegistry(), seen: map[string]bool{}}
	sp, _ := spool.New(t.TempDir())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := intake.New(cfg.Intake(), cfg.Partners, nil, sp, reg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.New(cfg.Reconcile, cfg.WorkerID, time.Minute, nil, sp, cfg.Partners, reg, log, nil); err != nil {
		t.Fatal(err)
	}
	newReloader("", cfg, nil, nil, expect.New(nil, cfg.WorkerID, cfg.ExpectCheck, cfg.Partners, reg, log),
		notify.New(nil, cfg.WorkerID, cfg.NotifyDelivery, cfg.Notify, cfg.Partners, reg, log), nil, reg, log)
	used := regexp.MustCompile(`\bintake_[a-z_]+`)
	for _, f := range []string{"../../configs/prometheus/alerts.yml", "../../configs/grafana/partner-intake.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		for _, m := range used.FindAllString(string(b), -1) {
			base := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suf)
			}
			if !reg.seen[base] && !reg.seen[m] {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Fatalf("%s uses metrics the daemon does not export: %v", f, missing)
		}
	}
	if len(reg.seen) < 20 {
		t.Fatalf("only %d metrics recorded", len(reg.seen))
	}
}

// database.max_conns caps the daemon's pool; 0 keeps pgxpool's default.
func TestPoolSizeComesFromTheConfig(t *testing.T) {
	cfg, err := config.Load("../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const url = "postgres://intake@127.0.0.1:5432/intake"
	def, err := poolConfig(cfg, url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database.MaxConns = 2
	two, err := poolConfig(cfg, url)
	if err != nil {
		t.Fatal(err)
	}
	if two.MaxConns != 2 || def.MaxConns < 4 {
		t.Fatalf("max_conns 2 gave a pool of %d; the default %d", two.MaxConns, def.MaxConns)
	}
	if two.ConnConfig.RuntimeParams["jit"] != "off" {
		t.Fatal("the pool lost intake's connection settings")
	}
}
