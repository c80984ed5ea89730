package setting

import (
	"testing"
	"time"
)

// An unset value takes its default, a set one stays; the errors name the
// key and print durations as durations.
func TestDefaultsAndBounds(t *testing.T) {
	n, d, s := 0, time.Duration(0), ""
	Default(&n, 5)
	Default(&s, "x")
	if err := Positive("drain", &d, 30*time.Second); err != nil || n != 5 || s != "x" || d != 30*time.Second {
		t.Fatalf("defaults: %d %q %s %v", n, s, d, err)
	}
	n = 7
	Default(&n, 5)
	if n != 7 {
		t.Fatalf("a set value was replaced: %d", n)
	}
	d = -time.Second
	if err := Positive("drain", &d, 30*time.Second); err == nil || err.Error() != "drain: -1s must be positive" {
		t.Fatalf("negative duration: %v", err)
	}
	var b int64 = -3
	if err := Positive("spool.min_free_bytes", &b, 1); err == nil || err.Error() != "spool.min_free_bytes: -3 must be positive" {
		t.Fatalf("negative size: %v", err)
	}
	for _, c := range []struct {
		v, want int
		err     string
	}{{0, 4, ""}, {1, 1, ""}, {10, 10, ""}, {11, 11, "sessions.max_open: 11 must be between 1 and 10"}, {-1, -1, "sessions.max_open: -1 must be between 1 and 10"}} {
		v := c.v
		err := Between("sessions.max_open", &v, 4, 1, 10)
		if got := ""; err != nil {
			got = err.Error()
			if got != c.err {
				t.Errorf("Between(%d): %q, want %q", c.v, got, c.err)
			}
		} else if c.err != "" {
			t.Errorf("Between(%d): no error, want %q", c.v, c.err)
		}
		if v != c.want {
			t.Errorf("Between(%d) left %d, want %d", c.v, v, c.want)
		}
	}
}
