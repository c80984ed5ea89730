// Package daemoncfg is the pipeline daemon's own configuration (worker
// id, lease, drain, spool floor, affinity, retry budget, session policy)
// with its defaults and validation, and the PostgreSQL pool settings the
// daemon expects (PoolConfig).
package daemoncfg

import (
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sessions"
	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/internal/setting"
	"github.com/partner-intake/partner-intake/migrations"
)

// Defaults of Config.
const (
	DefaultDrain        = 30 * time.Second
	DefaultSpoolMinFree = 256 << 20
)

// Config is the daemon's own configuration.
type Config struct {
	// WorkerID names this replica: stable across restarts (so it finds its
	// own processing/<id>/), unique among replicas. Default: the hostname.
	WorkerID string
	// Lease is how long a claim is held without a heartbeat.
	Lease time.Duration
	// Drain is how long Stop lets in-flight files finish before cancelling.
	Drain time.Duration
	// SpoolMinFree: below this many free bytes on the spool's disk the
	// daemon stops claiming (backpressure) until space returns.
	SpoolMinFree int64
	// Affinity: AffinityPartner (default) or AffinityNone (intake/affinity).
	Affinity string
	// Retry is the budget of a file whose runs fail transiently (intake/attempt.go).
	Retry RetryPolicy
	// Sessions is the SFTP session policy (intake/sessions).
	Sessions sessions.Policy
	// PollStagger spreads the polls of partners on one `@every` interval:
	// each keeps a stable phase within min(interval, partners ×
	// PollStagger) (intake/sessions).
	PollStagger time.Duration
	// ClaimDB, when set, holds the partners' claim sections
	// (ledger.ClaimLock) instead of the daemon's pool: a section keeps its
	// connection while its renames cross the network (Ledger.WithClaimPool).
	ClaimDB *pgxpool.Pool
}

// Replica affinity modes.
const (
	AffinityPartner = "partner" // one live replica polls each partner
	AffinityNone    = "none"    // every replica polls every partner
)

// RetryPolicy bounds the retries of one file: its runs are retried on
// their own backoff (Base doubling up to Max) until Attempts runs have
// failed or the first failure is older than Within; then the file fails
// with reason retries_exhausted. Zero values take the defaults.
type RetryPolicy struct {
	Attempts int           `yaml:"max_attempts"`
	Within   time.Duration `yaml:"within"`
	Base     time.Duration `yaml:"base"`
	Max      time.Duration `yaml:"max"`
}

// Defaults of RetryPolicy: about two hours of tries, at most ten minutes
// apart.
const (
	DefaultRetryAttempts = 12
	DefaultRetryWithin   = 6 * time.Hour
	DefaultRetryBase     = 5 * time.Second
	DefaultRetryMax      = 10 * time.Minute
)

// Validate fills defaults and checks the values.
func (c *Config) Validate() error {
	if c.Retry.Attempts < 0 || c.Retry.Within < 0 || c.Retry.Base < 0 || c.Retry.Max < 0 {
		return fmt.Errorf("retry: max_attempts, within, base and max must be positive (0: the default)")
	}
	setting.Default(&c.Retry.Attempts, DefaultRetryAttempts)
	setting.Default(&c.Retry.Within, DefaultRetryWithin)
	setting.Default(&c.Retry.Base, DefaultRetryBase)
	setting.Default(&c.Retry.Max, DefaultRetryMax)
	if c.WorkerID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("worker_id: not set and no hostname: %w", err)
		}
		c.WorkerID = h
	}
	if !names.WorkerID(c.WorkerID) {
		return fmt.Errorf("worker_id: %q must match %s", c.WorkerID, names.WorkerIDRule)
	}
	setting.Default(&c.Lease, ledger.DefaultLease)
	if c.Lease < 3*time.Second {
		return fmt.Errorf("lease: %s is too short (at least 3s)", c.Lease)
	}
	if err := setting.Positive("drain", &c.Drain, DefaultDrain); err != nil {
		return err
	}
	if err := setting.Positive("spool.min_free_bytes", &c.SpoolMinFree, DefaultSpoolMinFree); err != nil {
		return err
	}
	if err := c.Sessions.Validate(); err != nil {
		return err
	}
	if err := setting.Positive("poll_stagger", &c.PollStagger, sessions.DefaultPollStagger); err != nil {
		return err
	}
	switch c.Affinity {
	case "":
		c.Affinity = AffinityPartner
	case AffinityPartner, AffinityNone:
	default:
		return fmt.Errorf("affinity: %q is not %q or %q", c.Affinity, AffinityPartner, AffinityNone)
	}
	return nil
}

// PoolConfig is the pgxpool configuration the daemon expects. A worker
// stalled inside a transaction (a GC pause, SIGSTOP, a partition) holds the
// file's ledger row lock that a takeover needs; statement and
// idle-in-transaction timeouts equal to the lease make PostgreSQL end most
// such sessions by itself, and the application name lets a takeover find
// and end the rest (a COPY waiting for its stalled client is not ended by
// statement_timeout): see ledger.ClaimLock.TakeOver.
func PoolConfig(url, worker string, lease time.Duration) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if lease == 0 {
		lease = ledger.DefaultLease
	}
	ms := fmt.Sprint(lease.Milliseconds())
	pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = ms
	pc.ConnConfig.RuntimeParams["statement_timeout"] = ms
	pc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName(worker)
	// The server notices a client gone with its host (power, a partition)
	// within about a minute, not the kernel's two hours: such a client's
	// session holds what it held meanwhile (a COPY waiting for data keeps
	// its file's row lock, which the restarted worker's Resume waits for;
	// the reconciler's leader lock), and no timeout above ends it.
	pc.ConnConfig.RuntimeParams["tcp_keepalives_idle"] = "30"
	pc.ConnConfig.RuntimeParams["tcp_keepalives_interval"] = "10"
	pc.ConnConfig.RuntimeParams["tcp_keepalives_count"] = "3"
	// JIT compiling a chunk's merge costs more than running it (measured:
	// 836 ms of JIT for a 40 ms statement once its estimate crossed
	// jit_above_cost).
	pc.ConnConfig.RuntimeParams["jit"] = "off"
	// pg_catalog, then the ledger's schema: no schema a role or database
	// default adds, where a look-alike of a built-in could wait.
	migrations.SetSearchPath(pc.ConnConfig)
	return pc, nil
}
