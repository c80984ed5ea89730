//go:build !demo

package main

import (
	"fmt"
	"io"
)

// cmdDemo in a production build: the demo and its rigs are not linked in
// (see demo.go).
func cmdDemo(_ bool, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "intake demo: this build of intake has no demo; run `make demo` (go run -tags demo ./cmd/intake demo) from a clone")
	return 2
}
