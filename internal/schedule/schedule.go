// Package schedule builds robfig/cron/v3 schedulers the way every scheduled
// job of intake needs them: UTC, a panicking job recovered and logged (it
// must not kill the daemon), and a run skipped while the previous one is
// still going. robfig/cron/v3 is unmaintained; this is the one place that
// configures it.
package schedule

import (
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
