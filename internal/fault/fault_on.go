//go:build faults

// The fault hook itself: built only with the faults tag (see fault.go).

package fault

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

type armed struct {
	action string
	at     int64
	hits   atomic.Int64
	// pause: reached closes paused, Resume closes resume
	paused, resume chan struct{}
}

var (
	enabled atomic.Bool
	mu      sync.Mutex
	faults  map[string]*armed
)

func init() {
	if v := os.Getenv(Env); v != "" {
		if err := Set(v); err != nil {
			fmt.Fprintln(os.Stderr, "fault:", err)
			os.Exit(2)
		}
	}
}

// Set arms faults from a spec (see the package comment); "" disarms all.
func Set(spec string) error {
	m := map[string]*armed{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, rest, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("%s: %q is not name=action[@n]", Env, part)
		}
		action, nth, _ := strings.Cut(rest, "@")
		a := &armed{action: action, at: 1, paused: make(chan struct{}), resume: make(chan struct{})}
		if nth != "" {
			n, err := strconv.ParseInt(nth, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("%s: bad count in %q", Env, part)
			}
			a.at = n
		}
		if action != "kill" && action != "error" && action != "pause" && action != "stop" {
			return fmt.Errorf("%s: action %q is not kill, error, pause or stop", Env, action)
		}
		m[name] = a
	}
	mu.Lock()
	faults = m
	mu.Unlock()
	enabled.Store(len(m) > 0)
	return nil
}

// Paused returns a channel closed once the armed "pause" fault name is
// reached (nil when name is not armed).
func Paused(name string) <-chan struct{} {
	mu.Lock()
	defer mu.Unlock()
	if a := faults[name]; a != nil {
		return a.paused
	}
	return nil
}

// Resume lets a paused step go on.
func Resume(name string) {
	mu.Lock()
	defer mu.Unlock()
	if a := faults[name]; a != nil && a.action == "pause" {
		select {
		case <-a.resume:
		default:
			close(a.resume)
		}
	}
}

// Hits is how many times the armed fault name was reached (0 when name
// is not armed): a test's proof that a step ran.
func Hits(name string) int64 {
	mu.Lock()
	defer mu.Unlock()
	if a := faults[name]; a != nil {
		return a.hits.Load()
	}
	return 0
}

// Enabled reports whether any fault is armed (a cheap check for hot paths).
func Enabled() bool { return enabled.Load() }

// Check is a named step. An armed "kill" fault kills the process with
// SIGKILL on the configured hit; an "error" fault returns ErrInjected.
func Check(name string) error {
	if !enabled.Load() {
		return nil
	}
	mu.Lock()
	a := faults[name]
	mu.Unlock()
	if a == nil || a.hits.Add(1) != a.at {
		return nil
	}
	if a.action == "pause" {
		close(a.paused)
		<-a.resume
		return nil
	}
	if a.action == "stop" {
		fmt.Fprintf(os.Stderr, "fault: stopping the process at %s\n", name)
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return nil // SIGCONT goes on from here
	}
	if a.action == "kill" {
		fmt.Fprintf(os.Stderr, "fault: killing the process at %s\n", name)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL cannot be caught; wait for it
	}
	return fmt.Errorf("%w at %s", ErrInjected, name)
}
