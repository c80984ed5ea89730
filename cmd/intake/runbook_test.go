package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// runbookBase is where the alert rules' runbook links point by default:
// docs/runbook.md of the repository the chart names as its home. make
// alerts and the chart's prometheusRule.runbookBaseURL replace it whole.
func runbookBase(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/helm/intake/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct{ Home string }
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.Home == "" {
		t.Fatalf("Chart.yaml: no home: %v", err)
	}
	return chart.Home + "/blob/main/docs/runbook.md"
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// spaces to hyphens, punctuation other than hyphens and underscores
// dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every alert links to its runbook section by an absolute URL on the one
// base, and every link into docs/runbook.md anywhere in the repository
// (alerts, their promtool tests, docs, the chart, code) names a section
// the runbook has.
func TestRunbookLinksAreAbsoluteOnOneBaseAndExist(t *testing.T) {
	base := runbookBase(t)
	rb, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, l := range strings.Split(string(rb), "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			sections[githubAnchor(h)] = true
		} else if h, ok := strings.CutPrefix(l, "### "); ok {
			sections[githubAnchor(h)] = true
		}
	}

	b, err := os.ReadFile("../../configs/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			u := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(u, base+"#")
			if !ok {
				t.Errorf("alerts.yml %s: runbook_url %q is not %s#<section>", r.Alert, u, base)
			} else if !sections[anchor] {
				t.Errorf("alerts.yml %s: runbook_url %q: docs/runbook.md has no section #%s", r.Alert, u, anchor)
			}
		}
	}
	if alerts < 10 {
		t.Fatalf("alerts.yml: only %d alerts read", alerts)
	}

	// Every other link into the runbook, relative or absolute.
	link := regexp.MustCompile(`runbook\.md#([A-Za-z0-9_-]+)`)
	links := 0
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "dist", "bin", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".yml", ".yaml", ".json", ".go", ".txt", ".tpl", ".sh", ".html":
		default:
			return nil
		}
		if filepath.Base(path) == "CHANGELOG.md" || strings.HasSuffix(path, "runbook_test.go") {
			return nil // history, and this test's own pattern
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			links++
			if !sections[m[1]] {
				t.Errorf("%s links to runbook.md#%s: no such section", strings.TrimPrefix(path, "../../"), m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if links < alerts {
		t.Fatalf("only %d links into the runbook found, fewer than the %d alerts", links, alerts)
	}
}
