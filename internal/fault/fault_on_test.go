//go:build faults

package fault

import (
	"errors"
	"strings"
	"testing"
)

func TestSetArmsAndCheckFiresOnItsHit(t *testing.T) {
	if err := Set("a:step=error@2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Set("") })
	if !Enabled() {
		t.Fatal("Enabled is false with a fault armed")
	}
	if err := Check("a:step"); err != nil {
		t.Fatalf("first hit: %v, want nil (armed @2)", err)
	}
	if err := Check("a:step"); !errors.Is(err, ErrInjected) || !strings.Contains(err.Error(), "a:step") {
		t.Fatalf("second hit: %v, want ErrInjected at a:step", err)
	}
	if err := Check("a:step"); err != nil {
		t.Fatalf("third hit: %v, want nil (a fault fires once)", err)
	}
	if got := Hits("a:step"); got != 3 {
		t.Fatalf("Hits = %d, want 3", got)
	}
	if err := Check("other"); err != nil {
		t.Fatalf("unarmed step: %v", err)
	}
	if err := Set(""); err != nil || Enabled() {
		t.Fatalf("Set(\"\"): %v, Enabled %v; want all disarmed", err, Enabled())
	}
}

func TestSetRefusesABadSpec(t *testing.T) {
	for spec, want := range map[string]string{
		"garbage":        `"garbage" is not name=action`,
		"a=kill@0":       "bad count",
		"a=explode":      `action "explode" is not kill, error, pause or stop`,
		"a=error,b=halt": `action "halt"`,
	} {
		if err := Set(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Set(%q) = %v, want an error with %q", spec, err, want)
		}
	}
	if Enabled() {
		t.Fatal("a refused spec armed something")
	}
}
