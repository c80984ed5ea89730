package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
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

// metricNames records the metric families collectors describe when
// registered, each with its help text.
type metricNames struct {
	prometheus.Registerer
	seen map[string]string
}

var descRe = regexp.MustCompile(`fqName: "([^"]+)", help: "((?:[^"\\]|\\.)*)"`)

func (n *metricNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := descRe.FindStringSubmatch(d.String()); m != nil {
			help, err := strconv.Unquote(`"` + m[2] + `"`)
			if err != nil {
				help = m[2]
			}
			n.seen[m[1]] = help
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

// daemonMetrics are the metric families intake run registers (the same
// constructors run.go calls on its registry, with the example config),
// by name, with their help texts. Described, not gathered: a vector with
// no child yet is on /metrics only once it has one.
func daemonMetrics(t *testing.T) map[string]string {
	t.Helper()
	cfg, err := config.Load("../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg := &metricNames{Registerer: prometheus.NewRegistry(), seen: map[string]string{}}
	sp, _ := spool.New(t.TempDir())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := intake.New(cfg.Intake(), cfg.Partners, nil, sp, reg, log); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.New(cfg.Reconcile, cfg.WorkerID, time.Minute, nil, sp, cfg.Partners, reg, log, nil); err != nil {
		t.Fatal(err)
	}
	newReloader("", cfg, nil, nil, expect.New(nil, cfg.WorkerID, cfg.ExpectCheck, cfg.Partners, reg, log),
		notify.New(nil, cfg.WorkerID, cfg.NotifyDelivery, cfg.Notify, cfg.Partners, reg, log), nil, nil, reg, log)
	if len(reg.seen) < 20 {
		t.Fatalf("only %d metrics recorded", len(reg.seen))
	}
	return reg.seen
}

// metricRefs are the intake metric families an expression names (a
// histogram's _bucket, _sum and _count series count for the family).
func metricRefs(expr string, families map[string]string) []string {
	var refs []string
	for _, m := range metricToken.FindAllString(expr, -1) {
		if _, ok := families[m]; ok {
			refs = append(refs, m)
			continue
		}
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suf)
		}
		if _, ok := families[base]; ok {
			refs = append(refs, base)
		} else {
			refs = append(refs, m) // not a family: the caller names it
		}
	}
	return refs
}

var (
	metricToken   = regexp.MustCompile(`\bintake_[a-z0-9_]+`)
	externalLabel = regexp.MustCompile(`\$externalLabels\.[a-z0-9_]+`)
	yamlComment   = regexp.MustCompile(`(?m)^\s*#.*$`)
)

// The alert rules and the dashboard may only use metrics the daemon
// exports: a renamed metric must not silently disable an alert.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	families := daemonMetrics(t)
	for _, f := range []string{"../../configs/prometheus/alerts.yml", "../../configs/grafana/partner-intake.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// an external label (the console's base URL) and the comments
		// that name it are not metrics
		text := externalLabel.ReplaceAllString(yamlComment.ReplaceAllString(string(b), ""), "")
		var missing []string
		for _, m := range metricRefs(text, families) {
			if _, ok := families[m]; !ok {
				missing = append(missing, m)
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Fatalf("%s uses metrics the daemon does not export: %v", f, missing)
		}
	}
}

// dashboardPanel is a panel of configs/grafana/partner-intake.json: a
// row, or a graph with its queries.
type dashboardPanel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	ID      int    `json:"id"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// Every metric family the daemon registers has a dashboard panel whose
// query names it, under a row, except the deprecated names kept for one
// release (their help says "Deprecated: use X"; X has the panel), which no
// panel may use. Panel ids are unique and panels do not overlap.
func TestDashboardHasAPanelForEveryMetricFamily(t *testing.T) {
	families := daemonMetrics(t)
	b, err := os.ReadFile("../../configs/grafana/partner-intake.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	panelsOf := map[string][]string{}
	ids := map[int]string{}
	row := ""
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range dash.Panels {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d: %q and %q", p.ID, other, p.Title)
		}
		ids[p.ID] = p.Title
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at x=%d y=%d", other, p.Title, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			row = p.Title
			continue
		}
		if row == "" {
			t.Errorf("panel %q is above every row", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricRefs(tg.Expr, families) {
				panelsOf[m] = append(panelsOf[m], row+" / "+p.Title)
			}
		}
	}
	// Every query parses: promtool checks them as recording rules.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			expr := strings.NewReplacer(`"$partner"`, `".*"`, "$__rate_interval", "5m").Replace(tg.Expr)
			q, _ := json.Marshal(expr)
			fmt.Fprintf(&rules, "      - record: dashboard:panel%d:%d\n        expr: %s\n", p.ID, i, q)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.Command("bash", "../../.ci/promtool.sh").Output()
	if err != nil {
		t.Fatalf("promtool: %v", err)
	}
	if out, err := exec.Command(strings.TrimSpace(string(promtool)), "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}

	var missing []string
	for name, help := range families {
		if strings.HasPrefix(help, "Deprecated:") {
			if ps := panelsOf[name]; len(ps) > 0 {
				t.Errorf("deprecated %s (%q) is on panels %v", name, help, ps)
			}
			continue
		}
		if len(panelsOf[name]) == 0 {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%d of %d metric families have no dashboard panel: %v", len(missing), len(families), missing)
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
