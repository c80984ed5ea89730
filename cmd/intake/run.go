package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/opshttp"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// env is what run and reconcile share: config, database and spool.
type env struct {
	cfg   *config.File
	url   string
	pool  *pgxpool.Pool
	spool *spool.Spool
	log   *slog.Logger
}

// poolConfig is the daemon's pool for a config and database URL.
func poolConfig(cfg *config.File, url string) (*pgxpool.Config, error) {
	pc, err := intake.PoolConfig(url, cfg.WorkerID, cfg.Lease)
	if err != nil {
		return nil, err
	}
	if cfg.Database.MaxConns > 0 {
		pc.MaxConns = int32(cfg.Database.MaxConns)
	}
	return pc, nil
}

// claimPool is the daemon's pool for the partners' claim sections
// (database.claim_conns; ledger.Ledger.WithClaimPool). It connects lazily.
func claimPool(ctx context.Context, e *env) (*pgxpool.Pool, error) {
	pc, err := poolConfig(e.cfg, e.url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(e.cfg.Database.ClaimConns), 0
	return pgxpool.NewWithConfig(ctx, pc)
}

func open(ctx context.Context, path string, stderr io.Writer) (*env, int) {
	return openReporting(ctx, path, stderr, func(err error, code int) int { fmt.Fprintln(stderr, err); return code })
}

// openReporting is open with its errors given to fail (intake run logs
// them in the selected log format).
func openReporting(ctx context.Context, path string, stderr io.Writer, fail func(error, int) int) (*env, int) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, fail(err, 2)
	}
	url, err := cfg.DatabaseURL()
	if err != nil {
		return nil, fail(err, 2)
	}
	pc, err := poolConfig(cfg, url)
	if err != nil {
		return nil, fail(err, 2)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fail(fmt.Errorf("database: %w", err), 1)
	}
	sp, err := spool.New(cfg.Spool.Dir)
	if err != nil {
		pool.Close()
		return nil, fail(err, 1)
	}
	return &env{cfg: cfg, url: url, pool: pool, spool: sp, log: newLogger(stderr)}, 0
}

// fatalLogger reports the error that ends `intake run` before its services
// run as one record of the selected log format (one JSON line under
// --log-format json), with the exit code it ends with.
func fatalLogger(stderr io.Writer) func(err error, code int) int {
	log := newLogger(stderr)
	return func(err error, code int) int {
		log.Error("intake run: cannot start", "err", err, "exit_code", code)
		return code
	}
}

// migrate brings the schema up to date. golang-migrate (advisory-locked)
// runs only when the one-query check finds the schema behind: a restart
// costs one round trip.
func (e *env) migrate(ctx context.Context) error {
	if migrations.Current(ctx, e.pool) == nil {
		return nil
	}
	_, err := migrations.Up(e.url)
	return err
}

// openCmd is open for a one-shot command: a context that SIGINT and
// SIGTERM cancel, the env, and what releases both.
func openCmd(path string, stderr io.Writer) (context.Context, *env, func(), int) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	e, code := open(ctx, path, stderr)
	if e == nil {
		stop()
		return nil, nil, nil, code
	}
	return ctx, e, func() { e.pool.Close(); stop() }, 0
}

// stoppedWhileStarting: SIGTERM or SIGINT came during the schema and
// target checks. Nothing was claimed yet; the stop is as clean as a later
// one (exit 0), not a failed check.
func stoppedWhileStarting(e *env) int {
	e.log.Info("stopped before the start completed")
	return 0
}

// runCommand is `intake run`.
func runCommand() *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:     "run --config FILE [--once]",
		Short:   "run the daemon (applies migrations first)",
		Example: "intake run --config /etc/intake/intake.yaml",
	}
	cmd.Flags().BoolVar(&once, "once", false, "poll every partner once, then exit")
	return withConfig(cmd, "config file (YAML), e.g. /etc/intake/intake.yaml", func(path string, stdout, stderr io.Writer) int {
		return cmdRun(path, once, stdout, stderr)
	})
}

func cmdRun(path string, once bool, stdout, stderr io.Writer) int {
	fatal := fatalLogger(stderr)
	end := &ending{}
	defer end.run()
	// SIGHUP is caught from the start: its default would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	end.add(func() { signal.Stop(hup) })
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	end.add(stop)
	stopProfile, err := startCPUProfile()
	if err != nil {
		return fatal(err, 1)
	}
	defer stopProfile()
	// the pool connects lazily
	e, code := openReporting(ctx, path, stderr, fatal)
	if e == nil {
		return code
	}
	end.add(e.pool.Close)
	e.log.Info("starting", "version", currentVersion().String())
	if n, err := e.spool.Tighten(); err != nil {
		e.log.Warn("spool modes not tightened", "err", err)
	} else if n > 0 {
		e.log.Info("spool made readable by intake's user alone", "entries", n)
	}
	if missing := notify.MissingSecrets(e.cfg.Notify, e.cfg.Partners); len(missing) > 0 {
		return fatal(fmt.Errorf("notify: secret_env %v not set (webhooks are always signed)", missing), 2)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ic := e.cfg.Intake()
	var claims *pgxpool.Pool
	if !once {
		// A daemon's claim sections hold connections of their own while
		// their renames cross the network (docs/performance.md).
		// A one-shot run polls its partners one after another, so one
		// section at most is open at a time: it takes a connection of the
		// daemon's pool, whose first one the schema check makes beside
		// the login. A pool of its own would start a second PostgreSQL
		// backend for it, about 20 ms of the database's CPU (measured).
		var err error
		claims, err = claimPool(ctx, e)
		if err != nil {
			return fatal(fmt.Errorf("database: %w", err), 1)
		}
		defer claims.Close()
		ic.ClaimDB = claims
	}
	d, err := intake.New(ic, e.cfg.Partners, e.pool, e.spool, reg, e.log)
	if err != nil {
		return fatal(err, 2)
	}
	if once {
		// SSH handshakes overlap the schema and target checks. A daemon
		// dials when it first polls: with several replicas it polls only
		// the partners affinity gives it.
		d.Prewarm(ctx)
		// its sessions closed, its polls written and its worker id let
		// go on every way out (Stop)
		defer d.Stop()
	}
	// A daemon serves /healthz (200) and /readyz (503, saying what it
	// waits for) from here on, and waits for the database instead of
	// exiting: under an orchestrator an exit while the database is down
	// is a crash loop. A one-shot run fails at once.
	var waiting atomic.Pointer[error]
	setWaiting := func(err error) { waiting.Store(&err) }
	setWaiting(errors.New("starting: schema and target checks"))
	if !once && e.cfg.HTTP.Listen != "off" {
		srv := opshttp.New(e.cfg.HTTP.Listen, reg, opshttp.Checks{
			Starting: func() error { return *waiting.Load() },
			Database: func(ctx context.Context) error { return e.pool.Ping(ctx) },
			Schema:   func(ctx context.Context) error { return migrations.Current(ctx, e.pool) },
			Spool:    e.spool.Probe,
			Partners: func() any { return d.PartnerStates() },
		}, e.log)
		if err := srv.Start(context.WithoutCancel(ctx)); err != nil {
			return fatal(err, 1)
		}
		end.add(srv.Stop)
	}
	if !once {
		if err := waitForDatabase(ctx, e.pool, e.log, setWaiting); err != nil {
			var refused *loginRefusedError
			if errors.As(err, &refused) {
				return fatal(err, 1)
			}
			return stoppedWhileStarting(e)
		}
	}
	if err := e.migrate(ctx); err != nil {
		if ctx.Err() != nil {
			return stoppedWhileStarting(e)
		}
		return fatal(err, 1)
	}
	if once {
		// The worker id, taken on the pool's connection right after the
		// schema check, beside the logins: a run whose id another live
		// process holds (the daemon of this host, an earlier run still
		// going) polls nothing (intake/workerid.go). A daemon takes it in
		// Start, on a connection of its own.
		if err := d.HoldWorkerIDOnPool(ctx); err != nil {
			return fatal(err, 1)
		}
	}
	if err := d.CheckTargets(ctx); err != nil {
		if ctx.Err() != nil {
			return stoppedWhileStarting(e)
		}
		return fatal(err, 1)
	}
	logUntrustedCalls(ctx, e)
	if once {
		d.PreparePoll(ctx) // beside the logins still under way
		// A one-shot run's end is its process's: once its polls are
		// recorded and its sessions closed (Stop), its database
		// connections and signal handlers are let go without waiting
		// (ending).
		end.quick = true
		code := 0
		for _, p := range e.cfg.Partners {
			if err := d.PollOnce(ctx, p.ID); err != nil {
				e.log.Error("poll failed", "partner", p.ID, "err", err)
				code = 1
			}
		}
		// a feed whose target table cannot be written left its files in
		// ready/ while the others went on (intake/targethold.go)
		if held := d.HeldFeeds(); len(held) > 0 {
			e.log.Error("feeds held: their target tables cannot be written; their files wait in ready/",
				"reason", string(reason.TargetUnusable), "feeds", held)
			code = 1
		}
		return code
	}
	rec, err := reconcile.New(e.cfg.Reconcile, e.cfg.WorkerID, e.cfg.Lease, e.pool, e.spool, e.cfg.Partners, reg, e.log, d.TakenOver)
	if err != nil {
		return fatal(err, 2)
	}
	rec.WithClaimPool(claims)
	rec.OnlyWhileServed(d.Serves)
	setWaiting(nil)
	var services []service
	var con *console.Server
	if e.cfg.Console.Enabled() {
		con, err = console.New(ctx, e.cfg.Console, console.Deps{
			Pool: e.pool, Scope: consoleScope(e.pool, e.cfg), EveryReplicaPolls: e.cfg.Affinity == intake.AffinityNone,
			Worker: intake.OpsWorker(e.cfg.WorkerID),
			Replay: d.Replay,
			HeldFeeds: func() map[string]map[string]string {
				out := map[string]map[string]string{}
				for id, st := range d.PartnerStates() {
					out[id] = st.HeldFeeds
				}
				return out
			},
			Log: e.log.With("component", "console"),
		})
		if err != nil {
			return fatal(err, 1)
		}
		services = append(services, service{"console", con})
	}
	pg := &purger{e: e}
	ex := expect.New(e.pool, e.cfg.WorkerID, e.cfg.ExpectCheck, e.cfg.Partners, reg, e.log)
	delivery := e.cfg.NotifyDelivery
	if e.cfg.Console.Enabled() {
		delivery.ConsoleURL = e.cfg.Console.BaseURL // events about a file link its page
	}
	nt := notify.New(e.pool, e.cfg.WorkerID, delivery, e.cfg.Notify, e.cfg.Partners, reg, e.log)
	services = append(services, service{"daemon", d}, service{"reconciler", rec}, service{"expect", ex}, service{"notify", nt}, service{"purger", pg})
	var followConsole func(*config.File)
	if con != nil {
		followConsole = func(c *config.File) { con.Reload(c.Console.Auth, consoleScope(e.pool, c)) }
	}
	rl := newReloader(path, e.cfg, d, rec, ex, nt, pg, followConsole, reg, e.log)
	return runServices(ctx, stop, hup, rl.reload, e.log, stderr, services)
}

// ending is what `intake run` lets go of at its end, last taken first
// let go. A daemon waits for each. A one-shot run (quick) does not: its
// process ends with it, and the kernel closes what is left; waiting for
// the pool's goroutines beside PostgreSQL's backend exit and for the
// signal handlers' quiet took 0.2-10 ms of its end (measured:
// docs/performance.md).
type ending struct {
	fs    []func()
	quick bool
}

func (e *ending) add(f func()) { e.fs = append(e.fs, f) }

func (e *ending) run() {
	all := func() {
		for i := len(e.fs) - 1; i >= 0; i-- {
			e.fs[i]()
		}
	}
	if e.quick {
		go all()
		return
	}
	all()
}

// service is a long-running part of `intake run`, named for errors.
type service struct {
	name string
	svc  lifecycle.Service
}

// runServices is the one place the parts of `intake run` start and stop:
// in order (HTTP server, daemon, reconciler, expected-delivery evaluator,
// notification delivery, purger), and in reverse once
// SIGTERM or SIGINT cancels ctx. The parts run under contexts of their own
// that the signal does not cancel: their Stop does, after the daemon's
// drain (stop claiming, let files in flight finish for `drain`, then
// cancel). stopSignals restores the signals' default, so a second SIGTERM
// or SIGINT ends the process at once. SIGHUP (hup) arrives here too and
// calls reload (reload.go), one at a time.
func runServices(ctx context.Context, stopSignals func(), hup <-chan os.Signal, reload func(context.Context), log *slog.Logger, stderr io.Writer, services []service) int {
	var running []service
	defer func() {
		for i := len(running) - 1; i >= 0; i-- {
			running[i].svc.Stop()
		}
	}()
	for _, s := range services {
		if err := s.svc.Start(context.WithoutCancel(ctx)); err != nil {
			fmt.Fprintf(stderr, "intake run: %s: %v\n", s.name, err)
			return 1
		}
		running = append(running, s)
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("signal received: draining")
			stopSignals()
			return 0
		case <-hup:
			log.Info("SIGHUP received: reloading the config")
			reload(ctx) // a stop signal meanwhile ends the reload, and the loop drains
		}
	}
}

// purgeCommand is `intake purge`.
func purgeCommand() *cobra.Command {
	return withConfig(&cobra.Command{
		Use:     "purge --config FILE",
		Short:   "delete spool files, row issues, reports and audit rows past their retention",
		Example: "intake purge --config /etc/intake/intake.yaml",
	}, "", cmdPurge)
}

// cmdPurge deletes what is past its retention now and prints what it removed.
func cmdPurge(path string, stdout, stderr io.Writer) int {
	ctx, e, done, code := openCmd(path, stderr)
	if e == nil {
		return code
	}
	defer done()
	res, err := ops.Purge(ctx, e.pool, e.spool, e.cfg.Partners, e.cfg.Retention, time.Now())
	for _, r := range res {
		audit := fmt.Sprintf("%d audit entries", r.AuditEntries)
		if r.AuditSkipped {
			audit = "no audit entries (this database role may not purge the audit: the purge role of intake grants may)"
		}
		fmt.Fprintf(stdout, "%s: %d spool files (%d bytes), %d row issues, %d claim ids, %d reports, %s removed\n",
			r.Partner, r.SpoolFiles, r.SpoolBytes, r.RowIssues, r.ClaimIDs, r.Reports, audit)
	}
	if err != nil {
		// a site's names may be in it (a REMOVE refused)
		fmt.Fprintln(stderr, "intake purge:", inert.Lines(pgerr.Redact(err)))
		return 1
	}
	return 0
}

// reconcileCommand is `intake reconcile`.
func reconcileCommand() *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:     "reconcile --config FILE",
		Short:   "run the failure-matrix reconciler once; exit 1 when something needs a human",
		Example: "intake reconcile --config /etc/intake/intake.yaml",
	}
	cmd.Flags().BoolVar(&once, "once", true, "run once and exit (the daemon schedules it otherwise)")
	return withConfig(cmd, "", func(path string, stdout, stderr io.Writer) int { return cmdReconcile(path, once, stdout, stderr) })
}

// cmdReconcile runs the failure matrix once and prints its findings; it
// exits 1 when something needs a human, so scripts and cron can use it.
func cmdReconcile(path string, once bool, stdout, stderr io.Writer) int {
	if !once {
		fmt.Fprintln(stderr, "intake reconcile: only --once; `intake run` schedules the reconciler")
		return 2
	}
	ctx, e, done, code := openCmd(path, stderr)
	if e == nil {
		return code
	}
	defer done()
	rec, err := reconcile.New(e.cfg.Reconcile, e.cfg.WorkerID, e.cfg.Lease, e.pool, e.spool, e.cfg.Partners,
		prometheus.NewRegistry(), slogDiscard(), nil)
	if err != nil {
		fmt.Fprintln(stderr, "intake reconcile:", err)
		return 2
	}
	defer rec.Stop()
	found, err := runWhenFree(ctx, rec, stderr)
	reconcile.Sort(found)
	for _, f := range found {
		mark := "    "
		if f.NeedsHuman {
			mark = "ATTN"
		}
		fmt.Fprintf(stdout, "%s %-10s %-20s intake=%-6d %s: %s", mark, f.Partner, f.Kind, f.IntakeID, inert.Text(f.Path), inert.Text(f.Action))
		if f.Detail != "" {
			fmt.Fprintf(stdout, " (%s)", inert.Text(f.Detail))
		}
		fmt.Fprintln(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "intake reconcile:", inert.Lines(pgerr.Redact(err)))
		return 1
	}
	fmt.Fprintf(stdout, "%d finding(s)\n", len(found))
	if reconcile.NeedHuman(found) {
		return 1
	}
	return 0
}

// reconcileWait bounds how long `intake reconcile` waits for a run
// another process holds the reconciler's lock for (a daemon's scheduled
// run, another replica's).
const reconcileWait = 2 * time.Minute

// runWhenFree runs the reconciler once, after the run another process
// holds its lock for has ended: an operator's run beside a daemon reports
// the failure matrix, not that a scheduled run was in progress. Past
// reconcileWait it gives up with ErrNotLeader.
func runWhenFree(ctx context.Context, rec *reconcile.Reconciler, stderr io.Writer) ([]ledger.Finding, error) {
	// the bound is on the waiting only: the run itself has the caller's
	// context (each partner its own timeout)
	waited := time.NewTimer(reconcileWait)
	defer waited.Stop()
	told := false
	for {
		found, err := rec.RunOnce(ctx)
		if !errors.Is(err, reconcile.ErrNotLeader) {
			return found, err
		}
		if !told {
			fmt.Fprintln(stderr, "intake reconcile: another process's reconciler is running; waiting for it to end")
			told = true
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-waited.C:
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// migrateCommand is `intake migrate`.
func migrateCommand() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "migrate [--config FILE]",
		Short:   "apply the database schema (idempotent, safe with several replicas)",
		Example: "INTAKE_DATABASE_URL=postgres://intake@db/intake intake migrate",
	}
	cmd.Flags().StringVar(&path, "config", "", "config file (YAML); only database is read")
	return runs(cmd, func(_ []string, stdout, stderr io.Writer) int { return cmdMigrate(path, stdout, stderr) })
}

func cmdMigrate(path string, stdout, stderr io.Writer) int {
	url := os.Getenv(config.DefaultDatabaseURLEnv)
	if path != "" {
		cfg, err := config.Load(path)
		if err != nil {
			fmt.Fprintln(stderr, "intake migrate:", err)
			return 2
		}
		if url, err = cfg.DatabaseURL(); err != nil {
			fmt.Fprintln(stderr, "intake migrate:", err)
			return 2
		}
	}
	if url == "" {
		fmt.Fprintf(stderr, "intake migrate: give --config or set %s\n", config.DefaultDatabaseURLEnv)
		return 2
	}
	v, err := migrations.Up(url)
	if err != nil {
		fmt.Fprintln(stderr, "intake migrate:", err)
		return 1
	}
	fmt.Fprintf(stdout, "schema at version %d\n", v)
	return 0
}

// logUntrustedCalls logs, at start, each function a target calls as
// intake's role that `intake check` fails for (untrustedCalls), once per
// target; the daemon runs on. A target that cannot be read is left to
// CheckTargets, which has held its feeds.
func logUntrustedCalls(ctx context.Context, e *env) {
	seen := map[string]bool{}
	for i := range e.cfg.Partners {
		for j := range e.cfg.Partners[i].Feeds {
			tbl := e.cfg.Partners[i].Feeds[j].Target
			if seen[tbl] {
				continue
			}
			seen[tbl] = true
			calls, err := untrustedCalls(ctx, e.pool, tbl, e.cfg.Database.TrustedFunctionOwners)
			if err != nil {
				e.log.Warn("functions the target calls not read", "target", tbl, "err", err)
				continue
			}
			for _, c := range calls {
				e.log.Error("target calls a function of an untrusted owner, which runs as intake's role (intake check fails)",
					"target", tbl, "caller", c.by, "function", c.function, "owner", c.owner)
			}
		}
	}
}

// Backoff of the wait for the database at start: doubling from
// dbWaitFirst up to dbWaitMax, each step jittered by up to a quarter so
// replicas restarted together do not knock in step.
const (
	dbWaitFirst = 500 * time.Millisecond
	dbWaitMax   = 30 * time.Second
)

// dbRefusalsFinal is how many answers in a row that refuse intake's login
// (a wrong password, an unknown role or database, no pg_hba.conf entry)
// end the wait: a server that answers so is up and says no, and waiting
// on will not change it; a few allow for a pg_hba.conf being reloaded.
const dbRefusalsFinal = 3

// loginRefusedError: the database answered and refused intake's login
// dbRefusalsFinal times in a row.
type loginRefusedError struct{ err error }

func (e *loginRefusedError) Error() string {
	return fmt.Sprintf("the database refuses intake's login (%d times in a row; check database.url_env's user, password and database, and pg_hba.conf): %v", dbRefusalsFinal, e.err)
}
func (e *loginRefusedError) Unwrap() error { return e.err }

// refusesLogin reports whether err is the server's refusal of a login:
// SQLSTATE class 28 (invalid authorization: a wrong password, an unknown
// role, no pg_hba.conf entry) or 3D000 (no such database).
func refusesLogin(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "28") || pe.Code == "3D000")
}

// waitForDatabase pings the pool until the database answers, logging each
// failed attempt once with the wait before the next, and telling readiness
// (setWaiting) why the daemon is not ready. It returns ctx's error when a
// signal ends the wait, and a *loginRefusedError when the database
// refused the login dbRefusalsFinal times in a row: an unreachable
// database is waited for, one that says no is not.
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, setWaiting func(error)) error {
	wait := dbWaitFirst
	refusals := 0
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("database reachable", "attempt", attempt)
			}
			setWaiting(errors.New("starting: schema and target checks"))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		refusals++ // in a row: any other failure starts the count again
		if !refusesLogin(err) {
			refusals = 0
		}
		if refusals >= dbRefusalsFinal {
			return &loginRefusedError{err: err}
		}
		next := wait + time.Duration(rand.Int64N(int64(wait/4)+1))
		setWaiting(fmt.Errorf("waiting for the database (attempt %d, next in %s): %w", attempt, next.Round(time.Millisecond), err))
		log.Warn("database unreachable at start; waiting", "attempt", attempt, "retry_in", next.Round(time.Millisecond).String(), "err", err)
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, dbWaitMax)
	}
}
