package reconcile

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The reads of what the last runs stored (Reconciler.persist), for
// `intake status` (intake/ops): the reconciler owns intake_finding and
// intake_reconcile_run.

// LastRuns maps each of partners to when the reconciler last completed a
// run over it; a partner never reconciled is absent.
func LastRuns(ctx context.Context, db *pgxpool.Pool, partners []string) (map[string]time.Time, error) {
	rs, err := db.Query(ctx, `SELECT partner_id, run_at FROM intake_reconcile_run WHERE partner_id = ANY($1)`, partners)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for rs.Next() {
		var p string
		var at time.Time
		if err := rs.Scan(&p, &at); err != nil {
			rs.Close()
			return nil, err
		}
		out[p] = at
	}
	rs.Close()
	return out, rs.Err()
}

// StoredFindings lists the findings of the partners' last runs, by
// partner and kind.
func StoredFindings(ctx context.Context, db *pgxpool.Pool, partners []string) ([]Finding, error) {
	rs, err := db.Query(ctx, `SELECT partner_id, kind, coalesce(intake_id, 0), coalesce(path, ''), action, needs_human,
		coalesce(detail, '') FROM intake_finding WHERE partner_id = ANY($1) ORDER BY partner_id, kind`, partners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, func(r pgx.CollectableRow) (Finding, error) {
		var f Finding
		err := r.Scan(&f.Partner, &f.Kind, &f.IntakeID, &f.Path, &f.Action, &f.NeedsHuman, &f.Detail)
		return f, err
	})
}
