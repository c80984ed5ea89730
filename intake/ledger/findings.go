package ledger

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The reconciler's findings as stored in intake_finding and
// intake_reconcile_run (the reconciler writes them at the end of a run),
// and their reads for `intake status` (intake/ops).

// Finding kinds, one per failure-matrix situation (the rows of
// docs/failure-matrix.md).
const (
	KindOrphanClaim        = "orphan_claim"         // row 1
	KindLeaseExpired       = "lease_expired"        // rows 4, 5, 10
	KindStaleSpoolTemp     = "stale_spool_temp"     // row 4
	KindOutcomeUnknown     = "outcome_unknown"      // row 9
	KindRemoteMissing      = "remote_missing"       // row 12
	KindArchiveNoRecord    = "archive_no_record"    // row 13
	KindQuarantineNoRecord = "quarantine_no_record" // row 13, for quarantine/
	KindStaleUpload        = "stale_upload"         // row 14
	KindUnclaimableReady   = "unclaimable_ready"    // row 15
	KindHostKeyMismatch    = "host_key_mismatch"    // row 17
	KindPartnerDown        = "partner_unreachable"  // row 18
	KindQuarantined        = "quarantined"          // waits for ops
	KindTakeoverBlocked    = "takeover_blocked"     // a takeover could not complete
	KindPartnerFailed      = "partner_failed"       // the run could not finish the partner (a hung site, say)
)

// Finding kinds of the poison rows of the partner's site
// (docs/failure-matrix.md, "Poison: names and what a partner sees").
const (
	KindStaleRemoteTemp   = "stale_remote_temp"  // a receipt or reason file write killed half-way
	KindDecisionPublished = "decision_published" // a discard's receipt the ops command could not publish
)

// Finding is one mismatch and what was done about it.
type Finding struct {
	Kind       string
	Partner    string
	IntakeID   int64
	Path       string // a remote or spool path, with a partner's names as listed; never file contents
	Action     string // what the reconciler did
	NeedsHuman bool
	Detail     string
}

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
