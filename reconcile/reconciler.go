// Package reconcile is the failure matrix as code: a scheduled job that
// compares, per partner, what the SFTP site holds (ready/, processing/*/,
// archive/, quarantine/, incoming/) and the spool with the ledger's rows,
// and takes each matrix row's action or raises it for a human. Only one
// reconciler acts at a time across replicas (a PostgreSQL advisory lock).
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/robfig/cron/v3"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/leaderlock"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/schedule"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// Defaults of Config.
const (
	DefaultSchedule       = "@every 1m"
	DefaultStaleTemp      = 10 * time.Minute
	DefaultArchiveMonths  = 2
	DefaultPartnerTimeout = 5 * time.Minute
	lockKey               = "partner-intake/reconcile"
)

// Config of the reconciler.
type Config struct {
	// Schedule is a robfig/cron/v3 spec (UTC) or "@every 1m".
	Schedule string `yaml:"schedule"`
	// StaleTemp: spool temp files untouched this long belong to a dead
	// download and are deleted.
	StaleTemp time.Duration `yaml:"stale_temp"`
	// ArchiveMonths is how many months of archive/YYYY/MM/ (counting the
	// current one) are checked for files without a record.
	ArchiveMonths int `yaml:"archive_months"`
	// PartnerTimeout bounds the work on one partner in a run: past it the
	// partner's session is closed, its error becomes a finding and the run
	// goes on with the next partner (each SFTP request is bounded by the
	// partner's sftp.op_timeout on top).
	PartnerTimeout time.Duration `yaml:"partner_timeout"`
}

// Validate fills defaults and checks values.
func (c *Config) Validate() error {
	if c.Schedule == "" {
		c.Schedule = DefaultSchedule
	}
	if _, err := cron.ParseStandard(c.Schedule); err != nil {
		return fmt.Errorf("reconcile.schedule: %q: %w", c.Schedule, err)
	}
	if c.StaleTemp == 0 {
		c.StaleTemp = DefaultStaleTemp
	}
	if c.ArchiveMonths == 0 {
		c.ArchiveMonths = DefaultArchiveMonths
	}
	if c.PartnerTimeout == 0 {
		c.PartnerTimeout = DefaultPartnerTimeout
	}
	if c.PartnerTimeout < 0 {
		return fmt.Errorf("reconcile.partner_timeout: must be positive")
	}
	if c.StaleTemp < 0 || c.ArchiveMonths < 1 || c.ArchiveMonths > 24 {
		return fmt.Errorf("reconcile: stale_temp must be positive and archive_months between 1 and 24")
	}
	return nil
}

// Reconciler runs the matrix.
type Reconciler struct {
	cfg        Config
	worker     string
	db         *pgxpool.Pool
	ledger     *ledger.Ledger
	spool      *spool.Spool
	parts      *partners.Current
	log        *slog.Logger
	onTakeover func(partner string)
	// serves, if set, says whether this worker's daemon still serves a
	// partner; asked in the partner's claim section before a takeover or
	// an adoption into this worker's dir (OnlyWhileServed)
	serves func(partner string) bool

	runs        *prometheus.CounterVec
	findings    *prometheus.CounterVec
	lastFinds   *prometheus.GaugeVec
	lastSuccess prometheus.Gauge
	takeovers   *prometheus.CounterVec
	staleUps    *prometheus.GaugeVec
	orphans     *prometheus.GaugeVec
	// gauged: the partners the per-partner gauges have series for, so a
	// run after a reload removes those of partners no longer configured
	// (a removed partner's last count would otherwise alert for ever).
	gauged map[string]bool

	life   lifecycle.Base
	leader *leaderlock.Lock // one reconciler acts at a time across replicas
}

// SetPartners makes parts (validated) the partners of the next runs (a
// config reload); a run in progress goes on with those it started with.
func (r *Reconciler) SetPartners(parts []partners.Config) { r.parts.Set(parts) }

// OnlyWhileServed has the reconciler take a file over, or adopt one, into
// this worker's processing dir only while serves says its daemon serves
// the partner, asked in the partner's claim section: a reload removing
// the partner looks for this worker's rows of it in the same section
// (intake Daemon.Serves), so none lands after that look. Call it before
// Start.
func (r *Reconciler) OnlyWhileServed(serves func(partner string) bool) { r.serves = serves }

// served reports whether files of partner may come into this worker's
// hands.
func (r *Reconciler) served(partner string) bool { return r.serves == nil || r.serves(partner) }

// New builds a reconciler acting as worker (taken-over files move into
// processing/<worker>/ and are resumed by that daemon; onTakeover, if set,
// is called so it polls the partner at once).
func New(cfg Config, worker string, lease time.Duration, db *pgxpool.Pool, sp *spool.Spool, parts []partners.Config,
	reg prometheus.Registerer, log *slog.Logger, onTakeover func(partner string)) (*Reconciler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := promauto.With(reg)
	r := &Reconciler{cfg: cfg, worker: worker, db: db, ledger: ledger.New(db, lease), spool: sp, parts: partners.NewCurrent(parts),
		log: log.With("component", "reconcile", "worker", worker), onTakeover: onTakeover,
		runs: f.NewCounterVec(prometheus.CounterOpts{Name: "intake_reconcile_runs_total",
			Help: "Reconciler runs by result: ok, error, not_leader."}, []string{"result"}),
		findings: f.NewCounterVec(prometheus.CounterOpts{Name: "intake_reconcile_findings_total",
			Help: "Reconciler findings by kind."}, []string{"partner", "kind"}),
		lastFinds: f.NewGaugeVec(prometheus.GaugeOpts{Name: "intake_reconcile_last_findings",
			Help: "Findings of the last completed run, by kind."}, []string{"partner", "kind"}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{Name: "intake_reconcile_last_success_timestamp_seconds",
			Help: "Unix time of the last reconciler run that completed."}),
		staleUps: f.NewGaugeVec(prometheus.GaugeOpts{Name: "intake_stale_uploads",
			Help: "Abandoned *.part uploads in incoming/ at the last reconciler run."}, []string{"partner"}),
		orphans: f.NewGaugeVec(prometheus.GaugeOpts{Name: "intake_orphan_claims",
			Help: "Files in a processing/ dir with no live row (claims without an outcome) left at the last reconciler run."}, []string{"partner"}),
		takeovers: f.NewCounterVec(prometheus.CounterOpts{Name: "intake_lease_takeovers_total",
			Help: "Claims taken over from another worker (expired lease or orphaned claim)."}, []string{"partner"}),
	}
	if db != nil {
		r.leader = leaderlock.New(db.Config().ConnConfig, lockKey)
	}
	return r, nil
}

// WithClaimPool has the partners' claim sections the reconciler enters (a
// takeover and its move, an adoption) hold connections of claims, as the
// daemon's do (ledger.Ledger.WithClaimPool), not of the work pool its
// statements run on. It returns r.
func (r *Reconciler) WithClaimPool(claims *pgxpool.Pool) *Reconciler {
	r.ledger.WithClaimPool(claims)
	return r
}

// ErrNotLeader: another replica's reconciler holds the lock this time.
var ErrNotLeader = errors.New("another reconciler is running")

// RunOnce runs the whole matrix for every partner, under the cluster-wide
// advisory lock. One partner's failure does not stop the others.
func (r *Reconciler) RunOnce(ctx context.Context) ([]ledger.Finding, error) {
	if err := r.leader.Acquire(ctx); err != nil {
		if errors.Is(err, leaderlock.ErrHeld) {
			r.runs.WithLabelValues("not_leader").Inc()
			return nil, ErrNotLeader
		}
		r.runs.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	defer r.leader.Release(ctx)
	var all []ledger.Finding
	var errs []error
	parts := r.parts.Get()
	for i := range parts {
		p := &parts[i]
		// Each partner under its own deadline: a hung site costs this
		// partner's findings, never the others'.
		pctx, cancel := context.WithTimeout(ctx, r.cfg.PartnerTimeout)
		fs, err := r.partner(pctx, p)
		if err != nil && pctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w after %s (reconcile.partner_timeout): %v", pctx.Err(), r.cfg.PartnerTimeout, err)
		}
		cancel()
		all = append(all, fs...)
		if err != nil {
			errs = append(errs, fmt.Errorf("partner %s: %w", p.ID, err))
			all = append(all, ledger.Finding{Kind: ledger.KindPartnerFailed, Partner: p.ID, NeedsHuman: true,
				Action: "went on with the other partners; the next run tries again", Detail: pgerr.Redact(err)})
		}
		if ctx.Err() != nil {
			break
		}
	}
	r.record(parts, all)
	if err := r.persist(ctx, parts, all); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		r.runs.WithLabelValues("error").Inc()
		return all, err
	}
	r.runs.WithLabelValues("ok").Inc()
	r.lastSuccess.SetToCurrentTime()
	return all, nil
}

func (r *Reconciler) record(parts []partners.Config, fs []ledger.Finding) {
	r.lastFinds.Reset()
	now := make(map[string]bool, len(parts))
	for i := range parts {
		now[parts[i].ID] = true
		r.staleUps.WithLabelValues(parts[i].ID).Set(0)
		r.orphans.WithLabelValues(parts[i].ID).Set(0)
	}
	for id := range r.gauged {
		if !now[id] {
			r.staleUps.DeleteLabelValues(id)
			r.orphans.DeleteLabelValues(id)
		}
	}
	r.gauged = now
	for _, f := range fs {
		if f.Kind == ledger.KindStaleUpload {
			r.staleUps.WithLabelValues(f.Partner).Inc()
		}
		if f.Kind == ledger.KindOrphanClaim && f.IntakeID == 0 {
			r.orphans.WithLabelValues(f.Partner).Inc() // not adopted: still without a row
		}
		r.findings.WithLabelValues(f.Partner, f.Kind).Inc()
		if f.Kind == ledger.KindLeaseExpired || (f.Kind == ledger.KindOrphanClaim && f.IntakeID != 0) {
			r.takeovers.WithLabelValues(f.Partner).Inc()
		}
		r.lastFinds.WithLabelValues(f.Partner, f.Kind).Inc()
		level := slog.LevelInfo
		if f.NeedsHuman {
			level = slog.LevelWarn
		}
		r.log.Log(context.Background(), level, "finding", "kind", f.Kind, "partner", f.Partner, "intake_id", f.IntakeID,
			"path", f.Path, "action", f.Action, "needs_human", f.NeedsHuman, "detail", f.Detail)
	}
}

// persist replaces the stored findings of this run's partners, for
// `intake status`: each partner's in a transaction of its own, so a
// partner whose findings cannot be stored keeps its last run's (and its
// last run time, which says how old they are) and costs no other partner
// theirs. Text PostgreSQL cannot hold (a name that is not UTF-8, a NUL)
// is stored in its printable form (ledger.StoreFindings).
func (r *Reconciler) persist(ctx context.Context, parts []partners.Config, fs []ledger.Finding) error {
	by := make(map[string][]ledger.Finding, len(parts))
	for _, f := range fs {
		by[f.Partner] = append(by[f.Partner], f)
	}
	now := time.Now()
	hold := r.leader.Hold()
	held := func(ctx context.Context, tx pgx.Tx) error { return hold.Check(ctx, tx) }
	var errs []error
	for i := range parts {
		id := parts[i].ID
		err := ledger.StoreFindings(ctx, r.db, id, by[id], now, held)
		if errors.Is(err, leaderlock.ErrLost) {
			return fmt.Errorf("findings not stored: %w", err)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("store findings of partner %s: %w", id, err))
		}
		if ctx.Err() != nil {
			break
		}
	}
	return errors.Join(errs...)
}

// NeedHuman reports whether any finding waits for a person.
func NeedHuman(fs []ledger.Finding) bool {
	for _, f := range fs {
		if f.NeedsHuman {
			return true
		}
	}
	return false
}

// Sort orders findings for printing.
func Sort(fs []ledger.Finding) {
	sort.SliceStable(fs, func(i, j int) bool {
		if fs[i].Partner != fs[j].Partner {
			return fs[i].Partner < fs[j].Partner
		}
		return fs[i].Kind < fs[j].Kind
	})
}

// Start schedules RunOnce (UTC, recover, skip if still running) under the
// reconciler's own context, which Stop cancels.
func (r *Reconciler) Start(ctx context.Context) error {
	ctx, err := r.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	c := schedule.New(r.log)
	if _, err := c.AddFunc(r.cfg.Schedule, func() {
		_, err := r.RunOnce(ctx)
		if err != nil && !errors.Is(err, ErrNotLeader) && ctx.Err() == nil {
			r.log.Error("reconcile run failed", "err", err)
		}
	}); err != nil {
		return r.life.Abort(err)
	}
	c.Start()
	// Stop cancels ctx, which cuts a run in progress short; the scheduler
	// is then stopped and its run waited for.
	r.life.Go(func() {
		<-ctx.Done()
		<-c.Stop().Done()
	})
	return nil
}

// Stop cancels the reconciler's context (a run in progress ends early),
// waits for the run and closes the leader lock's connection. Safe before
// Start and more than once; a reconciler only ever run with RunOnce is
// stopped the same way.
func (r *Reconciler) Stop() {
	r.life.Stop()
	if r.leader != nil {
		r.leader.Close()
	}
}
