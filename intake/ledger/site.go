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
// 012, 017, 019 and 020): its profile, of which site (the partner's tree as
// the server resolves it), and when. Complete is false for a row measured
// before the profile had all it has now. The limits (Profile.MaxRead,
// Handles, Channels) are `intake check`'s, measured at LimitsMeasuredAt;
// zero, and the time zero, when no check measured them on this site.
type SiteProfile struct {
	Site             string
	Profile          partners.Profile
	Complete         bool
	MeasuredAt       time.Time
	LimitsMeasuredAt time.Time
}

const siteProfileCols = `site, rename_overwrites, posix_rename, hardlink, fsync, statvfs, empty_dir_persists,
	mtime_step_ms, case_insensitive, realpath, measured_at, posix_rename_fails, fsync_fails, statvfs_fails,
	max_read, handles, channels, limits_measured_at, rename_restamps_mtime`

func scanSiteProfile(row pgx.Row, p *SiteProfile) error {
	var posix, hard, fsync, statvfs, emptyDir, caseIns, realpath, posixFails, fsyncFails, statvfsFails, restamps *bool
	var step, maxRead, handles, channels *int32
	var limitsAt *time.Time
	if err := row.Scan(&p.Site, &p.Profile.RenameOverwrites, &posix, &hard, &fsync, &statvfs, &emptyDir,
		&step, &caseIns, &realpath, &p.MeasuredAt, &posixFails, &fsyncFails, &statvfsFails,
		&maxRead, &handles, &channels, &limitsAt, &restamps); err != nil {
		return err
	}
	p.Complete = realpath != nil && statvfsFails != nil && restamps != nil
	deref := func(b *bool) bool { return b != nil && *b }
	p.Profile.PosixRename, p.Profile.Hardlink, p.Profile.Fsync, p.Profile.StatVFS = deref(posix), deref(hard), deref(fsync), deref(statvfs)
	p.Profile.EmptyDirPersists, p.Profile.CaseInsensitive, p.Profile.RealPath = deref(emptyDir), deref(caseIns), deref(realpath)
	p.Profile.PosixRenameFails, p.Profile.FsyncFails, p.Profile.StatVFSFails = deref(posixFails), deref(fsyncFails), deref(statvfsFails)
	p.Profile.RenameRestampsMTime = deref(restamps)
	if step != nil {
		p.Profile.MtimeStep = time.Duration(*step) * time.Millisecond
	}
	num := func(n *int32) int {
		if n == nil {
			return 0
		}
		return int(*n)
	}
	p.Profile.MaxRead, p.Profile.Handles, p.Profile.Channels = num(maxRead), num(handles), num(channels)
	if limitsAt != nil {
		p.LimitsMeasuredAt = *limitsAt
	}
	return nil
}

// siteProfiles stores what a partner's site was measured to be, in
// intake_site_profile.
type siteProfiles struct{ *core }

// SiteProfile reads the partner's measured profile; nil when none.
func (l *siteProfiles) SiteProfile(ctx context.Context, partner string) (*SiteProfile, error) {
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
func (l *siteProfiles) SiteProfiles(ctx context.Context, partners []string) (map[string]SiteProfile, error) {
	rows, err := l.read.Query(ctx, `SELECT partner_id, `+siteProfileCols+` FROM intake_site_profile WHERE partner_id = ANY($1)`, partners)
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

// RecordSiteProfile records a fresh measurement of the partner's server
// (the daemon's, without the limits): the limits a check measured on the
// same site are kept, on another site they are forgotten.
func (l *siteProfiles) RecordSiteProfile(ctx context.Context, partner, site string, p partners.Profile) error {
	return l.recordSiteProfile(ctx, partner, site, p, false)
}

// RecordCheckedProfile records the profile `intake check` measured on the
// partner's server, its limits with it.
func (l *siteProfiles) RecordCheckedProfile(ctx context.Context, partner, site string, p partners.Profile) error {
	return l.recordSiteProfile(ctx, partner, site, p, true)
}

func (l *siteProfiles) recordSiteProfile(ctx context.Context, partner, site string, p partners.Profile, limits bool) error {
	var maxRead, handles, channels *int32
	if limits {
		n := func(v int) *int32 { x := int32(min(v, 1<<30)); return &x }
		maxRead, handles, channels = n(p.MaxRead), n(p.Handles), n(p.Channels)
	}
	_, err := l.pool.Exec(ctx, `INSERT INTO intake_site_profile AS s (partner_id, site, rename_overwrites, posix_rename, hardlink,
		    fsync, statvfs, empty_dir_persists, mtime_step_ms, case_insensitive, realpath, measured_at,
		    posix_rename_fails, fsync_fails, statvfs_fails, max_read, handles, channels, limits_measured_at, rename_restamps_mtime)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, pg_catalog.now(), $12, $13, $14, $15, $16, $17,
		    CASE WHEN $18::boolean THEN pg_catalog.now() END, $19)
		ON CONFLICT (partner_id) DO UPDATE SET site = EXCLUDED.site, rename_overwrites = EXCLUDED.rename_overwrites,
		    posix_rename = EXCLUDED.posix_rename, hardlink = EXCLUDED.hardlink, fsync = EXCLUDED.fsync,
		    statvfs = EXCLUDED.statvfs, empty_dir_persists = EXCLUDED.empty_dir_persists,
		    mtime_step_ms = EXCLUDED.mtime_step_ms, case_insensitive = EXCLUDED.case_insensitive,
		    realpath = EXCLUDED.realpath, measured_at = EXCLUDED.measured_at,
		    posix_rename_fails = EXCLUDED.posix_rename_fails, fsync_fails = EXCLUDED.fsync_fails,
		    statvfs_fails = EXCLUDED.statvfs_fails, rename_restamps_mtime = EXCLUDED.rename_restamps_mtime,
		    max_read = CASE WHEN $18::boolean THEN EXCLUDED.max_read WHEN s.site = EXCLUDED.site THEN s.max_read END,
		    handles = CASE WHEN $18::boolean THEN EXCLUDED.handles WHEN s.site = EXCLUDED.site THEN s.handles END,
		    channels = CASE WHEN $18::boolean THEN EXCLUDED.channels WHEN s.site = EXCLUDED.site THEN s.channels END,
		    limits_measured_at = CASE WHEN $18::boolean THEN EXCLUDED.limits_measured_at
		                              WHEN s.site = EXCLUDED.site THEN s.limits_measured_at END`,
		partner, site, p.RenameOverwrites, p.PosixRename, p.Hardlink, p.Fsync, p.StatVFS, p.EmptyDirPersists,
		int32(p.MtimeStep/time.Millisecond), p.CaseInsensitive, p.RealPath, p.PosixRenameFails, p.FsyncFails, p.StatVFSFails,
		maxRead, handles, channels, limits, p.RenameRestampsMTime)
	if err != nil {
		return fmt.Errorf("record site profile: %w", err)
	}
	return nil
}
