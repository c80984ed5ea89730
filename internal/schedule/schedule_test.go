package schedule

import (
	"testing"
	"time"
)

// A phased schedule ticks at Origin + k×Every, never at Origin itself (the
// caller's first run), whatever time it is asked from: its phase does not
// drift with late runs.
func TestPhasedKeepsItsPhase(t *testing.T) {
	o := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC).Add(7300 * time.Millisecond)
	s := Phased{Origin: o, Every: 30 * time.Second}
	for _, c := range []struct{ from, want time.Duration }{
		{-10 * time.Second, 30 * time.Second}, // before the first run
		{0, 30 * time.Second},
		{29 * time.Second, 30 * time.Second},
		{30 * time.Second, 60 * time.Second},
		{75*time.Second + 400*time.Millisecond, 90 * time.Second}, // a late run
	} {
		if got := s.Next(o.Add(c.from)); !got.Equal(o.Add(c.want)) {
			t.Errorf("Next(origin%+v) = origin%+v, want origin%+v", c.from, got.Sub(o), c.want)
		}
	}
}

func TestEveryAndOffset(t *testing.T) {
	if d, ok := Every("@every 30s"); !ok || d != 30*time.Second {
		t.Fatalf("Every(@every 30s) = %s, %v", d, ok)
	}
	if _, ok := Every("*/5 * * * *"); ok {
		t.Fatal("a cron expression counted as @every")
	}
	w := 30 * time.Second
	if a, b := Offset("p1", w), Offset("p1", w); a != b || a < 0 || a >= w {
		t.Fatalf("Offset(p1) = %s, %s: not stable or outside [0, %s)", a, b, w)
	}
	if Offset("p1", w) == Offset("p2", w) {
		t.Fatal("two partners share an offset")
	}
	if Offset("p1", 0) != 0 {
		t.Fatal("a zero window gave an offset")
	}
}
