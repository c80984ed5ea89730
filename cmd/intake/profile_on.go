//go:build cpuprofile

// CPU profiling of `intake run` for the benchmark work in
// docs/performance.md: built only with the cpuprofile tag (`go run
// ./cmd/intake-bench -profile-dir DIR` builds intake with it). The release
// binary has no such switch (profile_off.go).

package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"
)

// cpuProfileEnv names the file a profiling build writes its CPU profile to.
const cpuProfileEnv = "INTAKE_CPUPROFILE"

// startCPUProfile writes a pprof CPU profile of `intake run` to the file
// INTAKE_CPUPROFILE names, if set, until the returned function is called.
func startCPUProfile() (func(), error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	// INTAKE_HEAPPROFILE_AFTER (a duration d) also writes the heap in use
	// d after the start, beside the CPU profile (path.heap): what a fleet
	// holds once its sessions are up; and from then on, for d, the CPU
	// profile goes to path.idle (the fleet's idle cycle, its logins
	// done), after which profiling ends
	var mu sync.Mutex
	out := f
	stopTimers := func() {}
	if d, err := time.ParseDuration(os.Getenv(heapProfileEnv)); err == nil {
		t1 := time.AfterFunc(d, func() {
			runtime.GC()
			if h, err := os.Create(path + ".heap"); err == nil {
				pprof.Lookup("heap").WriteTo(h, 0)
				h.Close()
			}
			mu.Lock()
			defer mu.Unlock()
			pprof.StopCPUProfile()
			out.Close()
			if g, err := os.Create(path + ".idle"); err == nil && pprof.StartCPUProfile(g) == nil {
				out = g
			}
		})
		t2 := time.AfterFunc(2*d, func() {
			mu.Lock()
			defer mu.Unlock()
			pprof.StopCPUProfile()
			out.Close()
		})
		stopTimers = func() { t1.Stop(); t2.Stop() }
	}
	return func() {
		stopTimers()
		mu.Lock()
		defer mu.Unlock()
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

// heapProfileEnv names how long after its start a profiling build writes
// its heap profile.
const heapProfileEnv = "INTAKE_HEAPPROFILE_AFTER"
