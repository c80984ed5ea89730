package main

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// `intake run` with a console: block starts the review console on its
// own listener beside the ops one: a request from the configured proxy
// naming a reviewer gets the held queue; a reload that changes the
// reviewers is followed by the console at once; SIGTERM stops it with
// the rest.
func TestRunServesTheConsoleWhenConfigured(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "con")
	cfg := writeConfig(t, site, "")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	withReviewer := func(who string) string {
		return "console:\n  listen: localhost:0\n  base_url: http://localhost:9470\n  auth:\n    proxy: {header: X-Forwarded-User, from: [127.0.0.1, '::1']}\n    reviewers: [" + who + "]\n"
	}
	f.WriteString(withReviewer("alice@example.com"))
	f.Close()
	if code, out := runCLI("migrate", "--config", cfg); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	logs := &proc{}
	done := make(chan int, 1)
	go func() { done <- run([]string{"run", "--config", cfg}, logs, logs) }()
	addrRe := regexp.MustCompile(`"msg":"serving the review console".*?"addr":"([^"]+)"`)
	waitFor(t, 30*time.Second, func() bool { return addrRe.MatchString(logs.output()) }, logs)
	addr := addrRe.FindStringSubmatch(logs.output())[1]
	held := func(who string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+"/held", nil)
		req.Header.Set("X-Forwarded-User", who)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := held("alice@example.com"); code != http.StatusOK {
		t.Errorf("held queue through intake run: got %d, want 200", code)
	}
	// bob replaces alice: a reload, and no restart
	if err := os.WriteFile(cfg, append(base, withReviewer("bob@example.com")...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(logs.output(), "config reloaded") }, logs)
	if out := logs.output(); strings.Contains(out, "take effect at the next restart") {
		t.Errorf("a reload of the console's reviewers waits for a restart:\n%s", out)
	}
	if a, b := held("alice@example.com"), held("bob@example.com"); a != http.StatusForbidden || b != http.StatusOK {
		t.Errorf("after the reload: alice gets %d (want 403), bob %d (want 200)", a, b)
	}
	http.DefaultClient.CloseIdleConnections()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run exited %d:\n%s", code, logs.output())
		}
	case <-time.After(time.Minute):
		t.Fatalf("run did not stop:\n%s", logs.output())
	}
	if out := logs.output(); !strings.Contains(out, "serving /metrics") {
		t.Errorf("the ops listener did not start beside the console:\n%s", out)
	}
}
