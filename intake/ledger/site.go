package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/partners"
)

// SiteProfile is what a partner's server was measured to do (migrations
// 012 and 017): its profile, of which site (the partner's tree as the
// server resolves it), and when. Complete is false for a row measured
// before the profile had more than rename_overwrites.
type SiteProfile struct {
	Site       string
	Profile    partners.Profile
	Complete   bool
	MeasuredAt time.Time
}

const siteProfileCols = `site, rename_overwrites, posix_rename, hardlink, fsync, statvfs, empty_dir_persists,
	mtime_step_ms, case_insensitive, realpath, measured_at`

func scanSiteProfile(row pgx.Row, p *SiteProfile) error {
	var posix, hard, fsync, statvfs, emptyDir, caseIns, realpath *bool
	var step *int32
	if err := row.Scan(&p.Site, &p.Profile.RenameOverwrites, &posix, &hard, &fsync, &statvfs, &emptyDir,
		&step, &caseIns, &realpath, &p.MeasuredAt); err != nil {
		return err
	}
	p.Complete = realpath != nil
	deref := func(b *bool) bool { return b != nil && *b }
	p.Profile.PosixRename, p.Profile.Hardlink, p.Profile.Fsync, p.Profile.StatVFS = deref(posix), deref(hard), deref(fsync), deref(statvfs)
	p.Profile.EmptyDirPersists, p.Profile.CaseInsensitive, p.Profile.RealPath = deref(emptyDir), deref(caseIns), deref(realpath)
	if step != nil {
		p.Profile.MtimeStep = time.Duration(*step) * time.Millisecond
	}
	return nil
}

// SiteProfile reads the partner's measured profile; nil when none.
func (l *Ledger) SiteProfile(ctx context.Context, partner string) (*SiteProfile, error) {
	var p SiteProfile
	err := scanSiteProfile(l.pool.QueryRow(ctx, `SELECT `+siteProfileCols+` FROM intake_site_profile WHERE partner_id = $1`, partner), &p)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("site profile: %w", err)
	}
	return &p, nil
}

// SiteProfiles reads the measured profiles of the given partners (for
// `intake status`), by partner; a partner never measured is absent.
func (l *Ledger) SiteProfiles(ctx context.Context, partners []string) (map[string]SiteProfile, error) {
	rows, err := l.pool.Query(ctx, `SELECT partner_id, `+siteProfileCols+` FROM intake_site_profile WHERE partner_id = ANY($1)`, partners)
	if err != nil {
		return nil, fmt.Errorf("site profiles: %w", err)
	}
	defer rows.Close()
	out := map[string]SiteProfile{}
	for rows.Next() {
		var id string
		var p SiteProfile
		if err := scanSiteProfile(prefixed{rows, &id}, &p); err != nil {
			return nil, fmt.Errorf("site profiles: %w", err)
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("site profiles: %w", err)
	}
	return out, nil
}

// prefixed scans a row's first column into id and the rest as the
// wrapped scan asks.
type prefixed struct {
	rows pgx.Rows
	id   *string
}

func (p prefixed) Scan(dest ...any) error { return p.rows.Scan(append([]any{p.id}, dest...)...) }

// RecordSiteProfile records a fresh measurement of the partner's server.
func (l *Ledger) RecordSiteProfile(ctx context.Context, partner, site string, p partners.Profile) error {
	_, err := l.pool.Exec(ctx, `INSERT INTO intake_site_profile (partner_id, site, rename_overwrites, posix_rename, hardlink,
		    fsync, statvfs, empty_dir_persists, mtime_step_ms, case_insensitive, realpath, measured_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, pg_catalog.now())
		ON CONFLICT (partner_id) DO UPDATE SET site = EXCLUDED.site, rename_overwrites = EXCLUDED.rename_overwrites,
		    posix_rename = EXCLUDED.posix_rename, hardlink = EXCLUDED.hardlink, fsync = EXCLUDED.fsync,
		    statvfs = EXCLUDED.statvfs, empty_dir_persists = EXCLUDED.empty_dir_persists,
		    mtime_step_ms = EXCLUDED.mtime_step_ms, case_insensitive = EXCLUDED.case_insensitive,
		    realpath = EXCLUDED.realpath, measured_at = EXCLUDED.measured_at`,
		partner, site, p.RenameOverwrites, p.PosixRename, p.Hardlink, p.Fsync, p.StatVFS, p.EmptyDirPersists,
		int32(p.MtimeStep/time.Millisecond), p.CaseInsensitive, p.RealPath)
	if err != nil {
		return fmt.Errorf("record site profile: %w", err)
	}
	return nil
}
