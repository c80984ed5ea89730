package ops

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/leaderlock"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
	"github.com/partner-intake/partner-intake/spool"
)

// Retention says how long each copy of partner data is kept. Every copy
// has a rule and a purge path.
type Retention struct {
	// Spool: spooled bytes of files finished longer ago than this (files
	// still in flight or held for ops are always kept).
	Spool time.Duration `yaml:"spool"`
	// RowIssues: rejected/conflict row records of finished files.
	RowIssues time.Duration `yaml:"row_issues"`
	// Reports: receipts and rejects reports on the partners' sites.
	Reports time.Duration `yaml:"reports"`
	// Audit: audited ops actions.
	Audit time.Duration `yaml:"audit"`
	// Schedule runs the purge (robfig/cron/v3, UTC); "" = "@daily".
	Schedule string `yaml:"schedule"`
	// PartnerTimeout bounds the purge of one partner (its site's reports/
	// included); past it, or on any error, the purge reports the partner
	// and goes on with the next.
	PartnerTimeout time.Duration `yaml:"partner_timeout"`
}

// Default retention.
const (
	DefaultSpoolRetention    = 30 * 24 * time.Hour
	DefaultIssuesRetention   = 90 * 24 * time.Hour
	DefaultReportsRetention  = 90 * 24 * time.Hour
	DefaultAuditRetention    = 400 * 24 * time.Hour
	DefaultRetentionSchedule = "@daily"
	DefaultPurgeTimeout      = 10 * time.Minute
)

// SetDefaults fills unset fields.
func (r *Retention) SetDefaults() {
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&r.Spool, DefaultSpoolRetention}, {&r.RowIssues, DefaultIssuesRetention}, {&r.Reports, DefaultReportsRetention}, {&r.Audit, DefaultAuditRetention},
		{&r.PartnerTimeout, DefaultPurgeTimeout}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if r.Schedule == "" {
		r.Schedule = DefaultRetentionSchedule
	}
}

// Validate reports a retention that is not positive: a negative age would
// put the cutoff in the future and purge every finished file's spool
// bytes, row issues, audit entries and every receipt on the partners'
// sites at once.
func (r *Retention) Validate() error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"spool", r.Spool}, {"row_issues", r.RowIssues}, {"reports", r.Reports}, {"audit", r.Audit}, {"partner_timeout", r.PartnerTimeout}} {
		if f.v < 0 {
			return fmt.Errorf("retention.%s: %s must be positive", f.name, f.v)
		}
	}
	return nil
}

// Purged counts what a purge removed.
type Purged struct {
	Partner      string
	SpoolFiles   int
	SpoolBytes   int64
	RowIssues    int64
	ClaimIDs     int64 // ids claims kept for their files' paths (under row_issues)
	Reports      int
	AuditEntries int64
	// AuditSkipped: the role may not purge the audit (the daemon's); the
	// purge role's `intake purge` does (ledger.ErrNotPurgeRole).
	AuditSkipped bool
	Err          error // why the partner's purge stopped short; the others went on
}

// purgeLockKey names the advisory lock one purge at a time holds.
const purgeLockKey = "partner-intake/purge"

// ErrPurgeRunning: another replica's purge holds the lock.
var ErrPurgeRunning = errors.New("another purge is running")

// isReport: a receipt or a rejects report, sealed or not.
func isReport(name string) bool {
	name = strings.TrimSuffix(name, sitefile.EncryptedSuffix)
	return strings.HasSuffix(name, sitefile.ReceiptSuffix) || strings.HasSuffix(name, sitefile.RejectsSuffix)
}

// Purge removes what is past its retention, per partner, and says what it
// removed. Nothing a file in flight or held for ops still needs is touched.
func Purge(ctx context.Context, db *pgxpool.Pool, sp *spool.Spool, parts []partners.Config, ret Retention, now time.Time) ([]Purged, error) {
	ret.SetDefaults()
	// the lock on a connection of its own: the whole purge (SFTP
	// included) holds it, and the daemon's work pool keeps every
	// connection meanwhile
	lock := leaderlock.New(db.Config().ConnConfig, purgeLockKey)
	defer lock.Close()
	if err := lock.Acquire(ctx); err != nil {
		if errors.Is(err, leaderlock.ErrHeld) {
			return nil, ErrPurgeRunning
		}
		return nil, fmt.Errorf("purge: %w", err)
	}
	defer lock.Release(ctx)
	var out []Purged
	var errs []error
	for i := range parts {
		// Each partner under its own deadline, and one partner's failure
		// (a hung site, say) never keeps the others from being purged.
		pctx, cancel := context.WithTimeout(ctx, ret.PartnerTimeout)
		res, err := purgePartner(pctx, db, sp, &parts[i], ret, now)
		cancel()
		if err != nil {
			res.Err = fmt.Errorf("partner %s: %w", parts[i].ID, err)
			errs = append(errs, res.Err)
		}
		out = append(out, res)
		if ctx.Err() != nil {
			break
		}
	}
	return out, errors.Join(errs...)
}

// purgePartner purges one partner's copies.
func purgePartner(ctx context.Context, db *pgxpool.Pool, sp *spool.Spool, p *partners.Config, ret Retention, now time.Time) (Purged, error) {
	res := Purged{Partner: p.ID}
	if err := purgeSpool(ctx, db, sp, p.ID, now.Add(-ret.Spool), &res); err != nil {
		return res, fmt.Errorf("spool: %w", err)
	}
	l := ledgerOn(db)
	var err error
	if res.RowIssues, err = l.PurgeRowIssues(ctx, p.ID, now.Add(-ret.RowIssues)); err != nil {
		return res, fmt.Errorf("row issues: %w", err)
	}
	// claim ids kept that long (a claimer's crash between keeping one and
	// its RENAME leaves it), under the row issues' retention
	if res.ClaimIDs, err = l.PurgeClaimIDs(ctx, p.ID, now.Add(-ret.RowIssues)); err != nil {
		return res, err
	}
	// The audit rows first: they need no site, so a hung one does not
	// keep them past their retention.
	res.AuditEntries, err = l.PurgeAudit(ctx, p.ID, now.Add(-ret.Audit))
	switch {
	case errors.Is(err, ledger.ErrNotPurgeRole):
		res.AuditSkipped = true
	case err != nil:
		return res, fmt.Errorf("audit: %w", err)
	}
	if err := purgeReports(ctx, p, now.Add(-ret.Reports), &res); err != nil {
		return res, fmt.Errorf("reports: %w", err)
	}
	return res, nil
}

// purgeSpool deletes spooled files older than cutoff that no file in flight
// or held needs and whose last use finished before cutoff. One query per
// partner decides for all candidates.
func purgeSpool(ctx context.Context, db *pgxpool.Pool, sp *spool.Spool, partner string, cutoff time.Time, res *Purged) error {
	root := filepath.Join(sp.Dir(), partner, "sha256")
	cands := map[string]string{}
	var hashes []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		if info, err := e.Info(); err == nil && info.ModTime().Before(cutoff) {
			cands[e.Name()] = p
			hashes = append(hashes, e.Name())
		}
		return nil
	})
	if err != nil || len(hashes) == 0 {
		return err
	}
	keep, err := ledgerOn(db).SpoolInUse(ctx, partner, hashes, cutoff)
	if err != nil {
		return err
	}
	for h, p := range cands {
		if keep[h] {
			continue
		}
		if err := fault.Check("purge:before_remove"); err != nil {
			return err
		}
		// looked at again right before its removal: a replay that began
		// since renewed its mtime before it recorded its row (spool.Keep)
		info, err := os.Stat(p)
		if err != nil || !info.ModTime().Before(cutoff) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		res.SpoolFiles++
		res.SpoolBytes += info.Size()
	}
	return nil
}

// purgeReports deletes receipts and rejects reports older than cutoff from
// the partner's reports/ dir.
func purgeReports(ctx context.Context, p *partners.Config, cutoff time.Time, res *Purged) error {
	if p.Records() {
		return nil // claim: record writes no reports on the site
	}
	s, err := sftpconn.Dial(ctx, p)
	if err != nil {
		return err
	}
	defer s.Close()
	stop := s.CloseWhenDone(ctx) // the partner's deadline
	defer stop()
	dir := s.Layout.ReportsDir()
	// reports/ is streamed (a receipt for every file of the retention
	// period); only the names to delete are kept, and deleted after the
	// listing rather than while it runs
	var old []string
	err = s.ListDir(ctx, dir, func(e os.FileInfo) error {
		if e.Mode().IsRegular() && isReport(e.Name()) && e.ModTime().Before(cutoff) {
			old = append(old, e.Name())
		}
		return nil
	})
	if sftpconn.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return siteErr(ctx, err)
	}
	if err := fault.Check("purge:reports_listed"); err != nil {
		return err
	}
	for _, name := range old {
		// the listing's verdict is checked again right before the
		// removal: a decision made since (a release, a discard) publishes
		// its receipt under the same name, fresh, and the partner must
		// read it
		full := path.Join(dir, name)
		fi, err := s.Lstat(full)
		if sftpconn.IsNotExist(err) {
			continue
		}
		if err != nil {
			return siteErr(ctx, err)
		}
		if !fi.Mode().IsRegular() || !fi.ModTime().Before(cutoff) {
			continue
		}
		if err := s.Remove(full); err != nil && !sftpconn.IsNotExist(err) {
			return siteErr(ctx, err)
		}
		res.Reports++
	}
	return nil
}

// siteErr says when a call failed because the caller's deadline closed
// the session (its own error is then a bare "connection lost").
func siteErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
