// Package fault is the fault-injection hook the crash tests use to kill the
// daemon (SIGKILL, no cleanup) or fail a call at a named protocol step.
//
// It exists only in builds with the faults build tag (`go test -tags
// faults`, which `make test` uses). In every other build, the release
// binary included, Check is a no-op the compiler inlines away, Enabled
// is false, Set refuses with an error naming the tag, and the environment
// variable INTAKE_FAULTS is never read.
//
// In a faults build, INTAKE_FAULTS arms faults when the process starts:
//
//	INTAKE_FAULTS=apply:mid_chunk=kill@2,commit:reply_lost=error
//
// arms "kill" at the second time apply:mid_chunk is reached, and "error" at
// the first time commit:reply_lost is reached. Each fault fires once. An
// in-process test may also arm "pause": the step then waits until Resume
// (a slow step, to order two workers' steps deterministically). "stop"
// does that to a whole process from outside: it stops itself with
// SIGSTOP (every thread, its leases and connections as they are) after
// writing "fault: stopping the process at <name>" to stderr, and goes on
// from the step when the test sends SIGCONT.
package fault

import "errors"

// Env is the variable that arms faults in a faults build.
const Env = "INTAKE_FAULTS"

// ErrInjected is returned by Check when an "error" fault fires.
var ErrInjected = errors.New("injected fault")
