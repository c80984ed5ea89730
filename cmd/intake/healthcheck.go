package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/internal/inert"
)

// defaultHealthURL is the liveness endpoint of a daemon on this host with
// the packaged and image config (http.listen :9464).
const defaultHealthURL = "http://127.0.0.1:9464/healthz"

// healthcheckCommand is `intake healthcheck`.
func healthcheckCommand() *cobra.Command {
	var f healthcheckFlags
	cmd := &cobra.Command{
		Use:     "healthcheck [--url URL] [--ready] [--timeout D]",
		Short:   "ask a running daemon's /healthz (or /readyz): exit 0 when it answers 2xx, else 1; for a container HEALTHCHECK or an exec probe",
		Example: "intake healthcheck --url http://127.0.0.1:9464/healthz",
	}
	fs := cmd.Flags()
	fs.StringVar(&f.url, "url", defaultHealthURL, "the endpoint to ask")
	fs.BoolVar(&f.ready, "ready", false, "ask /readyz instead of /healthz (same host and port as --url)")
	fs.DurationVar(&f.timeout, "timeout", 3*time.Second, "give up after this long")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int { return cmdHealthcheck(f, args, stdout, stderr) })
}

// healthcheckFlags are intake healthcheck's flags.
type healthcheckFlags struct {
	url     string
	ready   bool
	timeout time.Duration
}

// cmdHealthcheck asks a running daemon's /healthz (or /readyz with
// --ready) and exits 0 on a 2xx answer, 1 on anything else or no answer.
// The image has no shell or curl, so its HEALTHCHECK and a Kubernetes exec
// probe run this; it needs no config and no database.
func cmdHealthcheck(f healthcheckFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "intake healthcheck: takes no arguments (got %q)\n", args[0])
		return 2
	}
	target, err := url.Parse(f.url)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		fmt.Fprintf(stderr, "intake healthcheck: --url %q: want http://HOST:PORT/PATH\n", f.url)
		return 2
	}
	if f.ready {
		target.Path = "/readyz"
	}
	if f.timeout <= 0 {
		fmt.Fprintf(stderr, "intake healthcheck: --timeout %v: want a positive duration\n", f.timeout)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		fmt.Fprintf(stderr, "intake healthcheck: %v\n", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "intake healthcheck: %s: %v\n", target, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	line := strings.TrimSpace(string(body))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintf(stderr, "intake healthcheck: %s: %s %s\n", target, inert.Text(resp.Status), inert.Lines(line)) // a poll error may quote a server
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s\n", target, resp.Status)
	return 0
}
