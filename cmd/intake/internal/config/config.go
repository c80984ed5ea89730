// Package config loads the daemon's YAML file strictly: an unknown or
// misspelt key is an error naming the key and its line.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/names"
	"github.com/partner-intake/partner-intake/internal/opshttp"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
)

// DefaultDatabaseURLEnv is read when database.url_env is not set.
const DefaultDatabaseURLEnv = "INTAKE_DATABASE_URL"

// DefaultClaimConns is database.claim_conns when it is not set.
const DefaultClaimConns = 8

// File is the whole configuration file.
type File struct {
	// WorkerID names this replica (default: hostname); stable across restarts.
	WorkerID string `yaml:"worker_id"`
	// Lease is how long a claim lives without a heartbeat (default 2m).
	Lease time.Duration `yaml:"lease"`
	// Drain is how long SIGTERM waits for files in flight (default 30s).
	Drain time.Duration `yaml:"drain"`
	// Affinity: "partner" (default) lets one live replica poll each
	// partner; "none" lets every replica poll every partner (they race for
	// the files, which lets several machines work one partner's backlog).
	Affinity string `yaml:"affinity"`
	// Retry bounds the retries of a file whose runs fail transiently.
	Retry intake.RetryPolicy `yaml:"retry"`
	// Sessions is the SFTP session policy: dials in parallel, open
	// sessions, idle close (intake/sessions.go).
	Sessions intake.SessionPolicy `yaml:"sessions"`
	// PollStagger spreads the polls of partners on one `@every` interval
	// (default 50ms: a partner's phase lies within min(interval, partners
	// × poll_stagger)).
	PollStagger time.Duration `yaml:"poll_stagger"`
	// Database says where PostgreSQL is.
	Database Database `yaml:"database"`
	// Spool is the local store of downloaded files.
	Spool Spool `yaml:"spool"`
	// Reconcile schedules the failure-matrix job.
	Reconcile reconcile.Config `yaml:"reconcile"`
	// HTTP serves /metrics, /healthz and /readyz.
	HTTP opshttp.Config `yaml:"http"`
	// Console is the review console (docs/console.md): off unless its
	// listen is set.
	Console console.Config `yaml:"console"`
	// ExpectCheck is how often each replica judges the delivery windows of
	// the feeds with an expect: block (default 15s; intake/expect).
	ExpectCheck time.Duration `yaml:"expect_check"`
	// Notify are webhooks for every partner's events (partners may add
	// their own); NotifyDelivery says how they are delivered.
	Notify         []partners.Notify `yaml:"notify"`
	NotifyDelivery notify.Config     `yaml:"notify_delivery"`
	// Retention of every copy of partner data, and when the purge runs.
	Retention ops.Retention `yaml:"retention"`
	// Ops are rules of the ops commands.
	Ops Ops `yaml:"ops"`
	// Partners are the drop sites to poll.
	Partners []partners.Config `yaml:"partners"`
}

// Ops are rules of the ops commands.
type Ops struct {
	// FourEyes refuses `intake approve` by the database user who released
	// the file from quarantine or requested it as a replay, as the audit
	// recorded them (default false). `intake grants` with this config makes
	// it the database's rule too (intake_ops_policy), binding the ops role
	// whatever config its CLI runs with.
	FourEyes bool `yaml:"four_eyes"`
}

// Database locates PostgreSQL. Prefer url_env: a URL with a password does
// not belong in a config file.
type Database struct {
	// URL is a libpq-style URL or key=value string.
	URL string `yaml:"url"`
	// URLEnv names an environment variable holding the URL
	// (default INTAKE_DATABASE_URL).
	URLEnv string `yaml:"url_env"`
	// MaxConns caps the daemon's connections (0: pgxpool's default, 4 or
	// the CPU count if larger). Fewer connections than the database has
	// cores keep its CPU on work instead of contention: with several
	// replicas on one database, keep their sum near its cores.
	MaxConns int `yaml:"max_conns"`
	// ClaimConns caps the connections the partners' claim sections hold
	// while their renames cross the network (default 8; apart from
	// MaxConns). Such a connection waits on the partner's site, idle in a
	// transaction, and costs the database no CPU (docs/performance.md).
	// `intake run --once` opens none: its partners are polled
	// one after another, their sections on MaxConns' connections.
	ClaimConns int `yaml:"claim_conns"`
	// TrustedFunctionOwners names the roles whose functions a target
	// table may call from a trigger, a column default, a CHECK of a
	// column's domain or an index expression: such a function runs as
	// intake's role. Functions in pg_catalog and information_schema are
	// always trusted; `intake check` fails for any other function whose
	// owner is not listed (empty by default).
	TrustedFunctionOwners []string `yaml:"trusted_function_owners"`
}

// Spool configures the local spool.
type Spool struct {
	// Dir holds spooled files; it must be on a local disk.
	Dir string `yaml:"dir"`
	// MinFreeBytes: below this much free space claiming pauses (default 256 MiB).
	MinFreeBytes int64 `yaml:"min_free_bytes"`
}

// Load reads and validates a config file, and refuses a partner's SSH
// key or password file that others may read (checkSecretFiles).
func Load(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	f, err := Parse(b)
	if err == nil {
		err = checkSecretFiles(f.Partners)
	}
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return f, nil
}

// Parse decodes and validates config bytes.
func Parse(b []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty file")
		}
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate fills defaults and reports the first problem by key.
func (f *File) Validate() error {
	if f.Database.URL != "" && f.Database.URLEnv != "" {
		return errors.New("database: set url or url_env, not both")
	}
	if f.Database.URL == "" && f.Database.URLEnv == "" {
		f.Database.URLEnv = DefaultDatabaseURLEnv
	}
	if f.Database.URLEnv != "" && !names.EnvName(f.Database.URLEnv) {
		// never echoed: a URL typed here in place of a variable's name
		// holds the password
		return errors.New("database.url_env: must be the name of an environment variable (letters, digits, '_', '.', '-'), not the URL itself")
	}
	if f.Database.MaxConns != 0 && (f.Database.MaxConns < 2 || f.Database.MaxConns > 500) {
		return fmt.Errorf("database.max_conns: %d must be 0 (the default) or between 2 and 500", f.Database.MaxConns)
	}
	if f.Database.ClaimConns == 0 {
		f.Database.ClaimConns = DefaultClaimConns
	}
	for i, r := range f.Database.TrustedFunctionOwners {
		if r == "" || len(r) > 63 {
			return fmt.Errorf("database.trusted_function_owners[%d]: %q is not a role name (1 to 63 bytes)", i, r)
		}
	}
	if f.Database.ClaimConns < 1 || f.Database.ClaimConns > 500 {
		return fmt.Errorf("database.claim_conns: %d must be 0 (the default, %d) or between 1 and 500", f.Database.ClaimConns, DefaultClaimConns)
	}
	if f.Spool.Dir == "" {
		return errors.New("spool.dir: required (a local directory for downloaded files)")
	}
	ic := f.Intake()
	if err := ic.Validate(); err != nil {
		return err
	}
	f.WorkerID, f.Lease, f.Drain, f.Spool.MinFreeBytes, f.Affinity, f.Retry = ic.WorkerID, ic.Lease, ic.Drain, ic.SpoolMinFree, ic.Affinity, ic.Retry
	f.Sessions, f.PollStagger = ic.Sessions, ic.PollStagger
	if err := f.Reconcile.Validate(); err != nil {
		return err
	}
	if f.ExpectCheck == 0 {
		f.ExpectCheck = expect.DefaultCheckEvery
	}
	if f.ExpectCheck < 100*time.Millisecond || f.ExpectCheck > time.Hour {
		return fmt.Errorf("expect_check: %s must be between 100ms and 1h", f.ExpectCheck)
	}
	if err := partners.ValidateNotify("notify", f.Notify); err != nil {
		return err
	}
	if err := f.NotifyDelivery.Validate(); err != nil {
		return err
	}
	if f.HTTP.Listen == "" {
		f.HTTP.Listen = opshttp.DefaultListen
	}
	if f.HTTP.Listen != "off" {
		if _, port, err := net.SplitHostPort(f.HTTP.Listen); err != nil || port == "" {
			return fmt.Errorf("http.listen: %q must be host:port (e.g. 127.0.0.1:9464) or off", f.HTTP.Listen)
		}
	}
	if err := f.Console.Validate(); err != nil {
		return err
	}
	if f.Console.Enabled() && f.HTTP.Listen == f.Console.Listen {
		return fmt.Errorf("console.listen: %q is http.listen's: the console has a listener of its own", f.Console.Listen)
	}
	f.Retention.SetDefaults()
	if err := f.Retention.Validate(); err != nil {
		return err
	}
	if _, err := cron.ParseStandard(f.Retention.Schedule); err != nil {
		return fmt.Errorf("retention.schedule: %q: %w", f.Retention.Schedule, err)
	}
	if len(f.Partners) == 0 {
		return errors.New("partners: at least one partner is required")
	}
	seen := map[string]int{}
	keys := make([]string, len(f.Partners))
	for i := range f.Partners {
		p := &f.Partners[i]
		p.SetDefaults()
		if err := p.Validate(fmt.Sprintf("partners[%d]", i)); err != nil {
			return err
		}
		if j, dup := seen[p.ID]; dup {
			return fmt.Errorf("partners[%d].id: %q appears twice (also partners[%d]); a partner id is part of every key, path and query", i, p.ID, j)
		}
		seen[p.ID] = i
		keys[i] = fmt.Sprintf("partners[%d] (id %s)", i, p.ID)
	}
	if err := partners.ValidateNotifyIDs(f.Notify, f.Partners); err != nil {
		return err
	}
	return partners.CheckSites(f.Partners, keys)
}

// Intake is the daemon part of the configuration.
func (f *File) Intake() intake.Config {
	return intake.Config{WorkerID: f.WorkerID, Lease: f.Lease, Drain: f.Drain, SpoolMinFree: f.Spool.MinFreeBytes, Affinity: f.Affinity, Retry: f.Retry,
		Sessions: f.Sessions, PollStagger: f.PollStagger}
}

// DatabaseURL resolves the database URL.
func (f *File) DatabaseURL() (string, error) {
	if f.Database.URL != "" {
		return f.Database.URL, nil
	}
	v, ok := os.LookupEnv(f.Database.URLEnv)
	if !ok || v == "" {
		return "", fmt.Errorf("database.url_env: environment variable %s is not set", f.Database.URLEnv)
	}
	return v, nil
}
