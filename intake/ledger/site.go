package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SiteProfile is what a partner's server was measured to do (migration
// 012): whether its RENAME overwrites an existing target, of which site
// (the partner's tree as the server resolves it), and when.
type SiteProfile struct {
	Site             string
	RenameOverwrites bool
	MeasuredAt       time.Time
}

// SiteProfile reads the partner's measured profile; nil when none.
func (l *Ledger) SiteProfile(ctx context.Context, partner string) (*SiteProfile, error) {
	var p SiteProfile
	err := l.pool.QueryRow(ctx, `SELECT site, rename_overwrites, measured_at FROM intake_site_profile WHERE partner_id = $1`,
		partner).Scan(&p.Site, &p.RenameOverwrites, &p.MeasuredAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("site profile: %w", err)
	}
	return &p, nil
}

// RecordSiteProfile records a fresh measurement of the partner's server.
func (l *Ledger) RecordSiteProfile(ctx context.Context, partner, site string, renameOverwrites bool) error {
	_, err := l.pool.Exec(ctx, `INSERT INTO intake_site_profile (partner_id, site, rename_overwrites, measured_at)
		VALUES ($1, $2, $3, pg_catalog.now())
		ON CONFLICT (partner_id) DO UPDATE SET site = EXCLUDED.site, rename_overwrites = EXCLUDED.rename_overwrites,
		    measured_at = EXCLUDED.measured_at`, partner, site, renameOverwrites)
	if err != nil {
		return fmt.Errorf("record site profile: %w", err)
	}
	return nil
}
