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
// naming a reviewer gets the held queue; SIGTERM stops it with the rest.
func TestRunServesTheConsoleWhenConfigured(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "con")
	cfg := writeConfig(t, site, "")
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("console:\n  listen: localhost:0\n  base_url: http://localhost:9470\n  auth:\n    proxy: {header: X-Forwarded-User, from: [127.0.0.1, '::1']}\n    reviewers: [alice@example.com]\n")
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
	req, _ := http.NewRequest("GET", "http://"+addr+"/held", nil)
	req.Header.Set("X-Forwarded-User", "alice@example.com")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("held queue through intake run: got %d, want 200", resp.StatusCode)
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
