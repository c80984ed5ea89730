package testenv

import (
	"strings"
	"testing"
	"time"
)

//go:noinline
func waitFor(ch chan struct{}) { <-ch }

// The hang report names the test still running and where it waits, and
// counts the module's other goroutines by where they wait.
func TestTheHangReportNamesTheRunningTestAndWhereItWaits(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{}, 2)
	defer close(block)
	for range 2 {
		go func() { started <- struct{}{}; waitFor(block) }()
	}
	<-started
	<-started
	// both are counted together once both wait in waitFor (each may
	// still be on its way there when it has said it started)
	var r string
	WaitFor(t, time.Minute, func() bool {
		r = hangReport(Stacks(), 14*time.Minute, 15*time.Minute)
		return strings.Contains(r, "   2 × internal/testenv.waitFor [chan receive]")
	}, func() string { return "the two waiting goroutines are not counted together:\n" + r })
	for _, want := range []string{
		"TestTheHangReportNamesTheRunningTestAndWhereItWaits",
		"the goroutines of the ",
		"internal/testenv.waitFor [chan receive]",
		"tests still running after 14m0s of the 15m0s timeout",
	} {
		if !strings.Contains(r, want) {
			t.Errorf("the report lacks %q:\n%s", want, r)
		}
	}
}
