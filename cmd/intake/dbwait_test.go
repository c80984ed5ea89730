package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// With the database down at start, `intake run` does not exit: it logs
// each attempt once with its backoff, /healthz answers 200 and /readyz 503
// saying it waits for the database; once PostgreSQL is back the daemon
// becomes ready, and SIGTERM still ends it with 0.
func TestRunWaitsForTheDatabaseAtStart(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "dbwait")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	if code, out := runCLI("migrate", "--config", cfg); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}

	// The server is the package's: it is started again in this test,
	// whatever happens.
	pg := testenv.PG()
	if err := pg.StopServer("fast"); err != nil {
		t.Fatal(err)
	}
	started := false
	defer func() {
		if !started {
			if err := pg.StartServer(); err != nil {
				t.Errorf("restart PostgreSQL: %v", err)
			}
		}
	}()

	logs := &proc{}
	done := make(chan int, 1)
	go func() { done <- run([]string{"--log-format", "json", "run", "--config", cfg}, logs, logs) }()
	addrRe := regexp.MustCompile(`"msg":"serving /metrics, /healthz, /readyz","addr":"([^"]+)"`)
	attemptRe := regexp.MustCompile(`"msg":"database unreachable at start; waiting","attempt":(\d+)`)
	waitFor(t, time.Minute, func() bool {
		select {
		case code := <-done:
			t.Fatalf("run exited %d while the database was down:\n%s", code, logs.output())
		default:
		}
		return addrRe.MatchString(logs.output()) && len(attemptRe.FindAllStringSubmatch(logs.output(), -1)) >= 2
	}, logs)
	base := "http://" + addrRe.FindStringSubmatch(logs.output())[1]
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("/healthz while waiting: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "waiting for the database") {
		t.Fatalf("/readyz while waiting: %d %s; want 503 saying it waits for the database", code, body)
	}
	// each attempt logged once, in order
	for i, m := range attemptRe.FindAllStringSubmatch(logs.output(), -1) {
		if want := i + 1; m[1] != itoa(want) {
			t.Fatalf("attempt lines %v: want 1, 2, … each once", attemptRe.FindAllString(logs.output(), -1))
		}
	}

	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	started = true
	waitFor(t, 2*time.Minute, func() bool {
		code, _ := get("/readyz")
		return code == 200
	}, logs)
	if !strings.Contains(logs.output(), `"msg":"database reachable"`) {
		t.Fatalf("no line saying the database is reachable:\n%s", logs.output())
	}
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
}

func itoa(i int) string { return strconv.Itoa(i) }

// A database that answers and refuses the login (an unknown role, a
// database that does not exist) is not waited for: `intake run` exits 1
// after a few refusals in a row, saying so in its log format. Only an
// unreachable database is waited on.
func TestRunExitsWhenTheDatabaseRefusesItsLogin(t *testing.T) {
	url, _ := testenv.DB(t)
	site := testenv.NewSite(t, "dbrefused")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	for _, c := range []struct{ name, url, code string }{
		{"unknown role", strings.Replace(url, "//postgres@", "//no_such_role@", 1), "28000"},
		{"unknown database", url[:strings.LastIndex(url, "/")] + "/no_such_db?sslmode=disable", "3D000"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("INTAKE_DATABASE_URL", c.url)
			logs := &proc{}
			done := make(chan int, 1)
			go func() { done <- run([]string{"--log-format", "json", "run", "--config", cfg}, logs, logs) }()
			select {
			case code := <-done:
				out := logs.output()
				if code != 1 || !strings.Contains(out, `"msg":"intake run: cannot start"`) || !strings.Contains(out, "the database refuses intake's login") ||
					!strings.Contains(out, c.code) {
					t.Fatalf("run exited %d, want 1 with the refusal (%s) logged as JSON:\n%s", code, c.code, out)
				}
			case <-time.After(time.Minute):
				syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
				<-done
				t.Fatalf("run still waits on a database that refuses its login:\n%s", logs.output())
			}
		})
	}
}
