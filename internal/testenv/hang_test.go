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
	r := hangReport(allStacks(), 14*time.Minute, 15*time.Minute)
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
	if !strings.Contains(r, "   2 × internal/testenv.waitFor [chan receive]") {
		t.Errorf("the two waiting goroutines are not counted together:\n%s", r)
	}
}
