//go:build demo

// The demo links a throwaway PostgreSQL, an in-process SFTP server, a key
// generator and an apt-get installer: none of that belongs in the daemon a
// production host runs, so it is built only with the demo tag
// (`make demo` runs `go run -tags demo ./cmd/intake demo`).

package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/demo"
)

func cmdDemo(once bool, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, demo.Options{Once: once, Out: stdout, Log: stderr}); err != nil {
		fmt.Fprintln(stderr, "intake demo:", err)
		return 1
	}
	return 0
}
