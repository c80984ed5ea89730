package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a pprof CPU profile of `intake run` to path until
// the returned function is called (INTAKE_CPUPROFILE; used by the
// benchmark work in docs/performance.md).
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
