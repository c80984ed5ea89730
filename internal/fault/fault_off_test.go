//go:build !faults

package fault

import (
	"strings"
	"testing"
)

// Without the faults tag nothing can be armed, and arming says why.
func TestWithoutTheTagNothingIsArmed(t *testing.T) {
	err := Set("a:step=error")
	if err == nil || !strings.Contains(err.Error(), "-tags faults") {
		t.Fatalf("Set = %v, want an error naming -tags faults", err)
	}
	if err := Set(""); err != nil {
		t.Fatalf("Set(\"\") = %v, want nil (nothing to disarm)", err)
	}
	if Enabled() {
		t.Fatal("Enabled is true")
	}
	if err := Check("a:step"); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
	if Hits("a:step") != 0 || Paused("a:step") != nil {
		t.Fatal("a step was recorded or paused")
	}
}
