// Package chartcheck decodes every object the intake Helm chart renders
// strictly: Kubernetes kinds into k8s.io/api types, the prometheus-operator
// kinds into local types covering the fields the chart sets, each with
// unknown fields refused. It is its own module so the daemon's go.mod
// carries no Kubernetes dependency; .ci/chart-test.sh renders the chart
// (helm template) and runs it with CHART_RENDERED naming the output.
package chartcheck

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// The prometheus-operator kinds (their Go types would pull in the
// operator's module): only what the chart renders, decoded strictly.
type meta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   meta   `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   meta       `json:"metadata"`
	Spec       ruleGroups `json:"spec"`
}

type rendered struct {
	sts *appsv1.StatefulSet
	cm  *corev1.ConfigMap
	// dashboard: the Grafana dashboard (grafanaDashboard.enabled).
	dashboard *corev1.ConfigMap
	svc       *corev1.Service
	pdb       *policyv1.PodDisruptionBudget
	sm        *serviceMonitor
	rule      *prometheusRule
	count     int
}

func strict(t *testing.T, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%T: %v\n%s", into, err, doc)
	}
}

func load(t *testing.T) rendered {
	return loadFrom(t, "CHART_RENDERED")
}

// loadFrom decodes the render named by the environment variable env.
func loadFrom(t *testing.T, env string) rendered {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run .ci/chart-test.sh (make chart-test)", env)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r rendered
	for _, doc := range bytes.Split(raw, []byte("\n---")) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		if head.Kind == "" {
			continue // a comment-only document
		}
		r.count++
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 StatefulSet":
			r.sts = new(appsv1.StatefulSet)
			strict(t, doc, r.sts)
		case "v1 ConfigMap":
			cm := new(corev1.ConfigMap)
			strict(t, doc, cm)
			switch {
			case cm.Data["intake.yaml"] != "":
				r.cm = cm
			case cm.Data["partner-intake.json"] != "":
				r.dashboard = cm
			default:
				t.Fatalf("a ConfigMap of neither the config nor the dashboard: %s", cm.Name)
			}
		case "v1 Service":
			r.svc = new(corev1.Service)
			strict(t, doc, r.svc)
		case "policy/v1 PodDisruptionBudget":
			r.pdb = new(policyv1.PodDisruptionBudget)
			strict(t, doc, r.pdb)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			r.sm = new(serviceMonitor)
			strict(t, doc, r.sm)
		case "monitoring.coreos.com/v1 PrometheusRule":
			r.rule = new(prometheusRule)
			strict(t, doc, r.rule)
		default:
			t.Fatalf("unexpected object %s %s: add it to this test", head.APIVersion, head.Kind)
		}
	}
	if r.sts == nil || r.cm == nil || r.svc == nil || r.pdb == nil || r.sm == nil || r.rule == nil {
		t.Fatalf("missing objects (render with serviceMonitor and prometheusRule enabled): %+v", r)
	}
	return r
}

// The daemon's config as the chart renders it: only the keys checked here.
type daemonConfig struct {
	WorkerID string `json:"worker_id"`
	Drain    string `json:"drain"`
	HTTP     struct {
		Listen string `json:"listen"`
	} `json:"http"`
	Spool struct {
		Dir string `json:"dir"`
	} `json:"spool"`
	Database struct {
		URLEnv string `json:"url_env"`
	} `json:"database"`
}

func TestRenderedChart(t *testing.T) {
	r := load(t)
	t.Logf("%d objects decoded strictly", r.count)

	var cfg daemonConfig
	if err := yaml.Unmarshal([]byte(r.cm.Data["intake.yaml"]), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	if cfg.WorkerID != "" {
		t.Errorf("config sets worker_id %q: the pod name (hostname) must be the worker_id", cfg.WorkerID)
	}
	if !strings.HasPrefix(cfg.HTTP.Listen, "0.0.0.0:") {
		t.Errorf("http.listen %q: the probes come from the kubelet", cfg.HTTP.Listen)
	}

	ps := r.sts.Spec.Template.Spec
	if r.sts.Spec.ServiceName != r.svc.Name || r.svc.Spec.ClusterIP != "None" {
		t.Errorf("the StatefulSet's service %q is not the headless service %q", r.sts.Spec.ServiceName, r.svc.Name)
	}
	drain, err := time.ParseDuration(cfg.Drain)
	if err != nil {
		t.Fatalf("drain %q: %v", cfg.Drain, err)
	}
	if ps.TerminationGracePeriodSeconds == nil || time.Duration(*ps.TerminationGracePeriodSeconds)*time.Second <= drain {
		t.Errorf("terminationGracePeriodSeconds %v not above drain %s", ps.TerminationGracePeriodSeconds, drain)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers", len(ps.Containers))
	}
	c := ps.Containers[0]
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe: %+v", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe: %+v", c.ReadinessProbe)
	}
	// Migrations and target checks run before /healthz answers: the
	// startup probe must allow minutes, liveness only starts after it.
	sp := c.StartupProbe
	if sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" || sp.HTTPGet.Port.String() != "http" {
		t.Errorf("startup probe not on /healthz: %+v", sp)
	} else if budget := time.Duration(sp.PeriodSeconds*sp.FailureThreshold) * time.Second; budget < 5*time.Minute {
		t.Errorf("startup probe allows %s before a restart: want at least 5m", budget)
	}
	if p := r.pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("PDB unhealthyPodEvictionPolicy %v: want AlwaysAllow (a database outage makes every pod NotReady; drains must go on)", p)
	}
	checkConfigInputs(t, r)
	var dbFromSecret bool
	for _, e := range c.Env {
		if e.Name == cfg.Database.URLEnv && e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			dbFromSecret = true
		}
	}
	if !dbFromSecret {
		t.Errorf("%s is not taken from a Secret: %+v", cfg.Database.URLEnv, c.Env)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	secrets := map[string]bool{}
	for _, v := range ps.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = true
		}
	}
	if !secrets["keys"] || !secrets["known-hosts"] || mounts["keys"] != "/etc/intake/keys" || mounts["known-hosts"] != "/etc/intake/known_hosts" {
		t.Errorf("keys and known_hosts are not Secret volumes at /etc/intake/: mounts %v, secret volumes %v", mounts, secrets)
	}
	if len(r.sts.Spec.VolumeClaimTemplates) != 1 || r.sts.Spec.VolumeClaimTemplates[0].Name != "spool" || mounts["spool"] != cfg.Spool.Dir {
		t.Errorf("the spool %q is not a PVC template mounted there: %v", cfg.Spool.Dir, mounts)
	}
	sc := ps.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod may run as root: %+v", sc)
	}
	if !reflect.DeepEqual(r.pdb.Spec.Selector.MatchLabels, r.sts.Spec.Selector.MatchLabels) {
		t.Errorf("PDB selects %v, StatefulSet %v", r.pdb.Spec.Selector.MatchLabels, r.sts.Spec.Selector.MatchLabels)
	}
	if !reflect.DeepEqual(r.sm.Spec.Selector.MatchLabels, r.svc.Spec.Selector) || len(r.sm.Spec.Endpoints) != 1 || r.sm.Spec.Endpoints[0].Port != r.svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor does not scrape the service: %+v", r.sm.Spec)
	}
}

// The PrometheusRule is configs/prometheus/alerts.yml, whole.
func TestPrometheusRuleIsTheAlertsFile(t *testing.T) {
	r := load(t)
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "configs", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var want ruleGroups
	if err := yaml.UnmarshalStrict(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Groups) == 0 || len(want.Groups[0].Rules) == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	if !reflect.DeepEqual(r.rule.Spec, want) {
		t.Errorf("PrometheusRule differs from configs/prometheus/alerts.yml:\n got %+v\nwant %+v", r.rule.Spec, want)
	}
	if e := downExpr(t, want); e != `up{job="intake"} == 0` {
		t.Errorf("alerts.yml IntakeDown: %q", e)
	}

	// With prometheusRule.job and runbookBaseURL set
	// (testdata/extras.yaml), IntakeDown matches that job and every
	// runbook_url is on that base; all else is the file's.
	x := loadFrom(t, "CHART_RENDERED_EXTRAS")
	if e := downExpr(t, x.rule.Spec); e != `up{job="intake-prod"} == 0` {
		t.Errorf("with prometheusRule.job intake-prod, IntakeDown: %q", e)
	}
	if len(x.rule.Spec.Groups) != len(want.Groups) {
		t.Fatalf("with prometheusRule.job set: %d groups, alerts.yml %d", len(x.rule.Spec.Groups), len(want.Groups))
	}
	for gi, g := range x.rule.Spec.Groups {
		if len(g.Rules) != len(want.Groups[gi].Rules) {
			t.Fatalf("with prometheusRule.job set: group %s has %d rules, alerts.yml %d", g.Name, len(g.Rules), len(want.Groups[gi].Rules))
		}
		for ri, rule := range g.Rules {
			if rule.Alert == "IntakeDown" {
				rule.Expr = want.Groups[gi].Rules[ri].Expr
			}
			const fileBase, base = "https://github.com/partner-intake/partner-intake/blob/main/docs/runbook.md#", "https://wiki.example.com/ops/intake/runbook.md#"
			if u := rule.Annotations["runbook_url"]; !strings.HasPrefix(u, base) || want.Groups[gi].Rules[ri].Annotations["runbook_url"] != fileBase+strings.TrimPrefix(u, base) {
				t.Errorf("with prometheusRule.runbookBaseURL %s, %s's runbook_url is %q (the file's: %q)", base, rule.Alert, u, want.Groups[gi].Rules[ri].Annotations["runbook_url"])
			} else {
				rule.Annotations = maps.Clone(rule.Annotations)
				rule.Annotations["runbook_url"] = want.Groups[gi].Rules[ri].Annotations["runbook_url"]
			}
			if !reflect.DeepEqual(rule, want.Groups[gi].Rules[ri]) {
				t.Errorf("with prometheusRule.job set, %s differs from alerts.yml", rule.Alert)
			}
		}
	}
}

func downExpr(t *testing.T, rg ruleGroups) string {
	t.Helper()
	for _, g := range rg.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "IntakeDown" {
				return rule.Expr
			}
		}
	}
	t.Fatal("no IntakeDown rule")
	return ""
}

// The daemon itself loads and validates the chart's config: `intake
// migrate` validates the whole file before it looks for the database URL,
// so with the URL unset a valid config ends at exactly that complaint.
// INTAKE_BIN is the daemon built by .ci/chart-test.sh.
func TestDaemonAcceptsTheChartsConfig(t *testing.T) {
	bin := os.Getenv("INTAKE_BIN")
	if bin == "" {
		t.Fatal("INTAKE_BIN is not set: run .ci/chart-test.sh (make chart-test)")
	}
	r := load(t)
	path := filepath.Join(t.TempDir(), "intake.yaml")
	if err := os.WriteFile(path, []byte(r.cm.Data["intake.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "migrate", "--config", path)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	want := "database.url_env: environment variable INTAKE_DATABASE_URL is not set"
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("intake migrate on the chart's config: %v\n%s\nwant only: %s", err, out, want)
	}
}

// checkConfigInputs: every environment variable the rendered config names
// (keys ending in _env, secret_envs) is set on the container, and every
// file it names (keys ending in _file, calendar, encrypt_reports_to) lies
// under a mount of a Secret or ConfigMap volume.
func checkConfigInputs(t *testing.T, r rendered) {
	t.Helper()
	var cfg any
	if err := yaml.Unmarshal([]byte(r.cm.Data["intake.yaml"]), &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	envs, files := map[string]string{}, map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := path + "." + k
				switch s, isString := x.(string); {
				case isString && strings.HasSuffix(k, "_env"):
					envs[s] = p
				case isString && (strings.HasSuffix(k, "_file") || k == "calendar" || k == "encrypt_reports_to"):
					files[s] = p
				case k == "secret_envs":
					for _, e := range x.([]any) {
						envs[e.(string)] = p
					}
				default:
					walk(p, x)
				}
			}
		case []any:
			for i, x := range v {
				walk(path+"["+strconv.Itoa(i)+"]", x)
			}
		}
	}
	walk("", cfg)
	ps := r.sts.Spec.Template.Spec
	c := ps.Containers[0]
	set := map[string]bool{}
	for _, e := range c.Env {
		set[e.Name] = e.Value != "" || e.ValueFrom != nil
	}
	for name, key := range envs {
		if !set[name] {
			t.Errorf("config%s names %s, which the container does not set: %+v", key, name, c.Env)
		}
	}
	fromObject := map[string]bool{}
	for _, v := range ps.Volumes {
		fromObject[v.Name] = v.Secret != nil || v.ConfigMap != nil || v.Projected != nil
	}
	for file, key := range files {
		var under bool
		for _, m := range c.VolumeMounts {
			if fromObject[m.Name] && m.SubPath == "" && strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
				under = true
			}
		}
		if !under {
			t.Errorf("config%s names %s, under no Secret or ConfigMap mount: %+v", key, file, c.VolumeMounts)
		}
	}
	t.Logf("config names %d variables and %d files; the container has each", len(envs), len(files))
}

// The chart rendered with extraEnv, envFrom, extraVolumes,
// extraVolumeMounts and startupProbe set (testdata/extras.yaml): the
// container gets each, as given, beside what the chart sets itself.
func TestExtras(t *testing.T) {
	r := loadFrom(t, "CHART_RENDERED_EXTRAS")
	var v struct {
		StartupProbe      corev1.Probe           `json:"startupProbe"`
		ExtraEnv          []corev1.EnvVar        `json:"extraEnv"`
		EnvFrom           []corev1.EnvFromSource `json:"envFrom"`
		ExtraVolumes      []corev1.Volume        `json:"extraVolumes"`
		ExtraVolumeMounts []corev1.VolumeMount   `json:"extraVolumeMounts"`
		Config            map[string]any         `json:"config"`
		PrometheusRule    map[string]any         `json:"prometheusRule"`
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "extras.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &v); err != nil {
		t.Fatalf("testdata/extras.yaml: %v", err)
	}
	if len(v.ExtraEnv) == 0 || len(v.EnvFrom) == 0 || len(v.ExtraVolumes) == 0 || len(v.ExtraVolumeMounts) == 0 {
		t.Fatal("testdata/extras.yaml sets not every extra")
	}
	ps := r.sts.Spec.Template.Spec
	c := ps.Containers[0]
	// The chart's own first, then the extras in their order.
	if len(c.Env) != 1+len(v.ExtraEnv) || !reflect.DeepEqual(c.Env[1:], v.ExtraEnv) {
		t.Errorf("env: got %+v, want the database URL then %+v", c.Env, v.ExtraEnv)
	}
	if !reflect.DeepEqual(c.EnvFrom, v.EnvFrom) {
		t.Errorf("envFrom: got %+v, want %+v", c.EnvFrom, v.EnvFrom)
	}
	if n := len(ps.Volumes); n < len(v.ExtraVolumes) || !reflect.DeepEqual(ps.Volumes[n-len(v.ExtraVolumes):], v.ExtraVolumes) {
		t.Errorf("volumes: got %+v, want them to end with %+v", ps.Volumes, v.ExtraVolumes)
	}
	if n := len(c.VolumeMounts); n < len(v.ExtraVolumeMounts) || !reflect.DeepEqual(c.VolumeMounts[n-len(v.ExtraVolumeMounts):], v.ExtraVolumeMounts) {
		t.Errorf("volumeMounts: got %+v, want them to end with %+v", c.VolumeMounts, v.ExtraVolumeMounts)
	}
	sp := c.StartupProbe
	if sp == nil || sp.PeriodSeconds != v.StartupProbe.PeriodSeconds || sp.FailureThreshold != v.StartupProbe.FailureThreshold || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" {
		t.Errorf("startup probe %+v: want /healthz with %+v", sp, v.StartupProbe)
	}
	// The config of this render names a webhook secret, a PGP passphrase,
	// an SFTP password, PGP key files and a calendar: all reach the pod.
	checkConfigInputs(t, r)
}

// The chart's default image is one `make image` builds: MAKE_IMAGE_N is
// what `make -n image` prints (the commands it would run). After
// .ci/image-build.sh builds $(IMAGE) (podman build -t "$IMAGE"), make tags
// it with the image the chart renders by default.
func TestDefaultImageIsOneMakeImageBuilds(t *testing.T) {
	r := load(t)
	path := os.Getenv("MAKE_IMAGE_N")
	if path == "" {
		t.Fatal("MAKE_IMAGE_N is not set: run .ci/chart-test.sh (make chart-test)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join("..", "..", "..", ".ci", "image-build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `-t "$IMAGE"`) {
		t.Fatal(`.ci/image-build.sh no longer builds -t "$IMAGE"`)
	}
	c := r.sts.Spec.Template.Spec.Containers[0]
	var built, tagged bool
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "bash" && f[1] == ".ci/image-build.sh":
			built = true
		case built && len(f) == 4 && f[0] == "podman" && f[1] == "tag" && f[3] == c.Image:
			tagged = true
		}
	}
	if !built || !tagged {
		t.Errorf("make image does not build and tag %s, the chart's default image: it runs\n%s", c.Image, raw)
	}
	if c.ImagePullPolicy == corev1.PullAlways {
		t.Errorf("imagePullPolicy Always: a locally built image cannot be pulled")
	}
	t.Logf("the chart's default image %s is tagged by make image", c.Image)
}

// The dashboard ConfigMap (rendered with grafanaDashboard.enabled) is
// configs/grafana/partner-intake.json byte for byte, labelled for
// Grafana's sidecar; values.yaml leaves it off.
func TestDashboardConfigMap(t *testing.T) {
	r := load(t)
	if r.dashboard == nil {
		t.Fatal("no dashboard ConfigMap (render with grafanaDashboard.enabled=true)")
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "..", "configs", "grafana", "partner-intake.json"))
	if err != nil {
		t.Fatal(err)
	}
	got := r.dashboard.Data["partner-intake.json"]
	if got != string(want) {
		t.Errorf("the dashboard ConfigMap differs from configs/grafana/partner-intake.json (%d bytes, want %d)", len(got), len(want))
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []any  `json:"panels"`
	}
	if err := json.Unmarshal([]byte(got), &d); err != nil || d.UID == "" || len(d.Panels) == 0 {
		t.Errorf("the dashboard is not a Grafana dashboard: uid %q, %d panels, %v", d.UID, len(d.Panels), err)
	}
	if r.dashboard.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard lacks the sidecar label grafana_dashboard=1: %v", r.dashboard.Labels)
	}
	raw, err := os.ReadFile(filepath.Join("..", "intake", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		GrafanaDashboard struct {
			Enabled *bool             `json:"enabled"`
			Labels  map[string]string `json:"labels"`
		} `json:"grafanaDashboard"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if v.GrafanaDashboard.Enabled == nil || *v.GrafanaDashboard.Enabled || v.GrafanaDashboard.Labels["grafana_dashboard"] != "1" {
		t.Errorf("values.yaml: grafanaDashboard should be off, labelled grafana_dashboard: \"1\": %+v", v.GrafanaDashboard)
	}
}

// The chart's README has a row in its values table for every top-level
// key of values.yaml, and every key of values.yaml is in the schema.
func TestEveryValueIsDocumentedAndInTheSchema(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "intake", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "intake", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	rawSchema, err := os.ReadFile(filepath.Join("..", "intake", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rawSchema, &schema); err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| `") {
			cell := strings.SplitN(line, "|", 3)[1]
			for _, k := range strings.Split(cell, "`") {
				rows[strings.SplitN(strings.TrimSpace(k), ".", 2)[0]] = true
			}
		}
	}
	for k := range values {
		if !rows[k] {
			t.Errorf("values.yaml's %s has no row in the README's values table", k)
		}
		if _, ok := schema.Properties[k]; !ok {
			t.Errorf("values.yaml's %s is not in values.schema.json", k)
		}
	}
}
