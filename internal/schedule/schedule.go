// Package schedule builds robfig/cron/v3 schedulers the way every scheduled
// job of intake needs them: UTC, a panicking job recovered and logged (it
// must not kill the daemon), and a run skipped while the previous one is
// still going. robfig/cron/v3 is unmaintained; this is the one place that
// configures it.
package schedule

import (
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"
)

// New returns a stopped scheduler logging to log.
func New(log *slog.Logger) *cron.Cron {
	l := logger{log}
	return cron.New(cron.WithLocation(time.UTC), cron.WithChain(cron.Recover(l), cron.SkipIfStillRunning(l)))
}

type logger struct{ l *slog.Logger }

func (c logger) Info(msg string, kv ...any) { c.l.Debug(msg, kv...) }
func (c logger) Error(err error, msg string, kv ...any) {
	c.l.Error(msg, append(kv, "err", err)...)
}

// Phased is an `@every` schedule whose ticks keep a fixed phase: Origin,
// then every Every after it. The first tick is Origin itself (the caller
// runs it: Next never returns Origin, only the ticks after it), so a
// fleet of jobs on one interval, each with its own Origin, stays spread
// over the interval instead of all firing together. robfig/cron's own
// ConstantDelaySchedule counts from each run and truncates to the second,
// which drifts jobs into the same second over time.
type Phased struct {
	Origin time.Time
	Every  time.Duration
}

// Next is the first tick after t (never Origin itself).
func (s Phased) Next(t time.Time) time.Time {
	if s.Every <= 0 {
		return time.Time{} // never
	}
	k := int64(1)
	if d := t.Sub(s.Origin); d >= 0 {
		k = int64(d/s.Every) + 1
	}
	return s.Origin.Add(time.Duration(k) * s.Every)
}

// Every reports the interval of spec when it is an `@every` schedule (the
// interval robfig/cron would use: whole seconds, at least one).
func Every(spec string) (time.Duration, bool) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return 0, false
	}
	c, ok := s.(cron.ConstantDelaySchedule)
	if !ok {
		return 0, false
	}
	return c.Delay, true
}

// Next is the first tick of spec after t, as robfig/cron's standard
// parser reads spec (`@every` included); ok is false for a spec it does
// not parse.
func Next(spec string, t time.Time) (next time.Time, ok bool) {
	s, err := cron.ParseStandard(spec)
	if err != nil {
		return time.Time{}, false
	}
	return s.Next(t.UTC()), true
}

// Offset is a stable phase for key within window: the same key and window
// give the same offset in every process, and keys spread evenly over
// [0, window).
func Offset(key string, window time.Duration) time.Duration {
	if window <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64()
	// splitmix64's finaliser: FNV alone spreads similar names poorly
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return time.Duration(float64(x>>11) / float64(1<<53) * float64(window))
}
