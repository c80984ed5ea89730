package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The exit code is what a container HEALTHCHECK and an exec probe read:
// 0 for a 2xx answer, 1 for any other answer or none, 2 for a bad flag.
func TestHealthcheckExitCodes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok\n"))
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"ready":false,"reason":"database: connection refused"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	// A port nothing listens on: bound, then closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/healthz"
	l.Close()

	for _, tc := range []struct {
		name     string
		args     []string
		want     int
		inStderr string
	}{
		{"a 200 from /healthz is healthy", []string{"--url", srv.URL + "/healthz"}, 0, ""},
		{"--ready asks /readyz, whose 503 is unhealthy with its reason", []string{"--url", srv.URL + "/healthz", "--ready"}, 1, "database: connection refused"},
		{"a 404 is unhealthy", []string{"--url", srv.URL + "/nothing"}, 1, "404"},
		{"no listener is unhealthy", []string{"--url", closed}, 1, "healthcheck"},
		{"a URL without a host is a usage error", []string{"--url", "healthz"}, 2, "--url"},
		{"a stray argument is a usage error", []string{"now"}, 2, "takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			got := run(append([]string{"healthcheck"}, tc.args...), &out, &errb)
			if got != tc.want {
				t.Fatalf("exit %d, want %d (stdout %q, stderr %q)", got, tc.want, out.String(), errb.String())
			}
			if tc.inStderr != "" && !strings.Contains(errb.String(), tc.inStderr) {
				t.Fatalf("stderr %q does not mention %q", errb.String(), tc.inStderr)
			}
		})
	}
}
