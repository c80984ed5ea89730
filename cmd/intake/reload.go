package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/reconcile"
)

// reloader applies a changed config file to a running `intake run` on
// SIGHUP (`systemctl reload intake`). The file is read and validated whole
// (config.Load), then every target table of an added or changed feed is
// checked (Daemon.Reload); a file that fails either is refused and the
// config in force is kept, said by a log line and by
// intake_config_last_reload_successful going to 0. What a reload applies:
// the partners (added ones are polled, removed ones stop once nothing of
// this daemon's is left of them, else the reload is refused, changed ones
// take effect at their next poll: see intake/reload.go), the reconciler's partners, the
// feeds' expect: blocks (calendars are read again), the webhooks (notify:
// the subscriptions of events fanned out from then on, and the URL and
// secrets of every delivery sent from then on, by its endpoint id; one
// whose secret_env or secret_envs is unset refuses the reload) and
// the retention periods, and what the review console covers (its
// partners, ops.four_eyes, its reviewers and viewers). Daemon-wide
// settings (worker_id, lease, drain, affinity, retry, database, spool,
// http, reconcile, retention.schedule, the console's listener and
// sign-in) wait for a restart: a reload that changes them says so in a
// warning.
type reloader struct {
	path string
	cur  *config.File
	d    *intake.Daemon
	rec  *reconcile.Reconciler
	ex   *expect.Service
	nt   *notify.Service
	pg   *purger
	// console follows the config (nil: no console)
	console func(*config.File)
	log     *slog.Logger

	reloads  *prometheus.CounterVec
	lastOK   prometheus.Gauge
	lastTime prometheus.Gauge
}

func newReloader(path string, cur *config.File, d *intake.Daemon, rec *reconcile.Reconciler, ex *expect.Service, nt *notify.Service, pg *purger,
	console func(*config.File), reg prometheus.Registerer, log *slog.Logger) *reloader {
	f := promauto.With(reg)
	r := &reloader{path: path, cur: cur, d: d, rec: rec, ex: ex, nt: nt, pg: pg, console: console, log: log,
		reloads: f.NewCounterVec(prometheus.CounterOpts{Name: "intake_config_reloads_total",
			Help: "Config reloads (SIGHUP) by result: ok, or error (the config in force was kept)."}, []string{"result"}),
		lastOK: f.NewGauge(prometheus.GaugeOpts{Name: "intake_config_last_reload_successful",
			Help: "1 when the last config reload (or the start) succeeded, 0 when the last reload was refused."}),
		lastTime: f.NewGauge(prometheus.GaugeOpts{Name: "intake_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful config load (the start or a reload)."}),
	}
	r.lastOK.Set(1)
	r.lastTime.SetToCurrentTime()
	return r
}

// reload re-reads the config file and applies it, or refuses it whole;
// within a minute, and not past stop's end (a stop signal: the reload is
// abandoned, and the daemon drains at once rather than after it).
func (r *reloader) reload(stop context.Context) {
	ctx, cancel := context.WithTimeout(stop, time.Minute)
	defer cancel()
	next, err := config.Load(r.path)
	var res intake.ReloadResult
	if err == nil {
		if missing := notify.MissingSecrets(next.Notify, next.Partners); len(missing) > 0 {
			err = fmt.Errorf("notify: secret_env %v not set (webhooks are always signed)", missing)
		}
	}
	if err == nil {
		res, err = r.d.Reload(ctx, next.Partners)
	}
	if err != nil {
		r.failed(stop, err)
		return
	}
	r.rec.SetPartners(next.Partners)
	r.ex.SetPartners(next.Partners)
	r.nt.SetConfig(next.Notify, next.Partners)
	applied := *r.cur
	applied.Partners, applied.Retention, applied.Ops = next.Partners, next.Retention, next.Ops
	applied.Retention.Schedule = r.cur.Retention.Schedule // the purger's schedule is set at its start
	applied.Console.Auth.Reviewers, applied.Console.Auth.Viewers = next.Console.Auth.Reviewers, next.Console.Auth.Viewers
	r.pg.setConfig(&applied)
	if r.console != nil {
		r.console(&applied)
	}
	if later := restartOnly(r.cur, next); len(later) > 0 {
		r.log.Warn("config reloaded; these settings take effect at the next restart", "keys", later)
	}
	r.cur = &applied
	r.reloads.WithLabelValues("ok").Inc()
	r.lastOK.Set(1)
	r.lastTime.SetToCurrentTime()
	r.log.Info("config reloaded", "config", r.path, "added", res.Added, "removed", res.Removed, "changed", res.Changed)
}

// failed says why a reload was not applied. One that the stop signal cut
// short (its error is the stop's cancel) is abandoned: no verdict on the
// file, so it is said at Info and the reload metrics keep what the last
// finished reload said (no alert while the daemon drains). Any other
// failure, the stop or not, is the file's refusal.
func (r *reloader) failed(stop context.Context, err error) {
	if stop.Err() != nil && errors.Is(err, context.Canceled) {
		r.log.Info("config reload abandoned: the daemon is stopping; the config in force is kept", "config", r.path, "err", err)
		return
	}
	r.reloads.WithLabelValues("error").Inc()
	r.lastOK.Set(0)
	r.log.Error("config reload refused; the config in force is kept", "config", r.path, "err", err)
}

// restartOnly names the settings that differ between cur and next and
// that a reload does not apply. The review console follows its partners,
// ops.four_eyes and its reviewers and viewers (consoleScope); its
// listener and sign-in are set at its start.
func restartOnly(cur, next *config.File) []string {
	var keys []string
	for _, k := range []struct {
		key  string
		a, b any
	}{
		{"worker_id", cur.WorkerID, next.WorkerID},
		{"lease", cur.Lease, next.Lease},
		{"drain", cur.Drain, next.Drain},
		{"affinity", cur.Affinity, next.Affinity},
		{"retry", cur.Retry, next.Retry},
		{"sessions", cur.Sessions, next.Sessions},
		{"poll_stagger", cur.PollStagger, next.PollStagger},
		{"database", cur.Database, next.Database},
		{"spool", cur.Spool, next.Spool},
		{"reconcile", cur.Reconcile, next.Reconcile},
		{"http", cur.HTTP, next.HTTP},
		{"expect_check", cur.ExpectCheck, next.ExpectCheck},
		{"notify_delivery", cur.NotifyDelivery, next.NotifyDelivery},
		{"retention.schedule", cur.Retention.Schedule, next.Retention.Schedule},
		{"console", consoleStart(cur.Console), consoleStart(next.Console)},
	} {
		if !reflect.DeepEqual(k.a, k.b) {
			keys = append(keys, k.key)
		}
	}
	return keys
}

// consoleStart is what of the console's config only its start takes:
// all but its reviewers and viewers.
func consoleStart(c console.Config) console.Config {
	c.Auth.Reviewers, c.Auth.Viewers = nil, nil
	return c
}

// consoleScope is what the review console covers under cfg; a reload
// gives it the reloaded config's.
func consoleScope(pool *pgxpool.Pool, cfg *config.File) console.Scope {
	parts := cfg.Partners
	return console.Scope{Partners: configuredIDs(parts), Polls: pollSpecs(parts), SnapshotFeeds: snapshotFeeds(parts), FourEyes: cfg.Ops.FourEyes,
		Publish: func(ctx context.Context, id int64) error { return ops.PublishDecision(ctx, pool, parts, id) }}
}
