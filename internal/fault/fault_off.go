//go:build !faults

// Without the faults tag there is no fault hook: nothing reads
// INTAKE_FAULTS, no step can be killed, failed or paused (see fault.go).

package fault

import "errors"

// errNotBuilt is what Set says in a build without the hook.
var errNotBuilt = errors.New("fault injection is compiled in only with -tags faults (go test -tags faults)")

// Set refuses: this build has no fault hook, so a test that arms a fault
// fails instead of passing without one. "" (disarm all) is accepted.
func Set(spec string) error {
	if spec == "" {
		return nil
	}
	return errNotBuilt
}

// Paused returns nil: no fault is ever armed.
func Paused(string) <-chan struct{} { return nil }

// Resume does nothing.
func Resume(string) {}

// Hits is 0: no fault is ever armed.
func Hits(string) int64 { return 0 }

// Enabled is false.
func Enabled() bool { return false }

// Check is a named step; without the hook it does nothing.
func Check(string) error { return nil }
