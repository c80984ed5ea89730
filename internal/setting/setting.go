// Package setting is what every number of intake's configuration goes
// through once decoded: a zero value (unset) replaced by its default, and
// the value checked against its bounds, named by its key in the error.
// The daemon's settings (intake/daemoncfg), its session policy
// (intake/sessions) and a partner's (partners) share these steps.
package setting

import "fmt"

// Number is a setting these checks bound: a count, a byte size or a
// duration (an error prints it as its type does: 30s, not 30000000000).
type Number interface {
	~int | ~int64
}

// Default sets *v to def when *v is its type's zero value (unset).
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Positive is Default, then an error naming key for a negative value:
// "KEY: V must be positive".
func Positive[T Number](key string, v *T, def T) error {
	Default(v, def)
	if *v < 0 {
		return fmt.Errorf("%s: %v must be positive", key, *v)
	}
	return nil
}

// Between is Default, then an error naming key for a value outside
// [lo, hi]: "KEY: V must be between LO and HI".
func Between[T Number](key string, v *T, def, lo, hi T) error {
	Default(v, def)
	if *v < lo || *v > hi {
		return fmt.Errorf("%s: %v must be between %v and %v", key, *v, lo, hi)
	}
	return nil
}
