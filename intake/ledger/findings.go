package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/inert"
)

// The reconciler's findings as stored in intake_finding and
// intake_reconcile_run (the reconciler writes them at the end of a run,
// StoreFindings), and their reads for `intake status` (intake/ops).

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
func LastRuns(ctx context.Context, db Reader, partners []string) (map[string]time.Time, error) {
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
func StoredFindings(ctx context.Context, db Reader, partners []string) ([]Finding, error) {
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

// StoreFindings replaces the stored findings of one partner with fs, the
// reconcile run's at now, and its last run time, in one transaction; a
// host key mismatch the last run did not find is notified in it, once per
// episode. held fences the transaction by the run's leadership (its first
// statement; its error is returned). Text PostgreSQL cannot hold (a name
// that is not UTF-8, a NUL) is stored in its printable form (storable).
func StoreFindings(ctx context.Context, db *pgxpool.Pool, id string, fs []Finding, now time.Time, held func(context.Context, pgx.Tx) error) error {
	var mismatch []string
	for _, f := range fs {
		if f.Kind == KindHostKeyMismatch {
			mismatch = []string{id}
		}
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// only while the run that found them leads: a run whose
		// leadership ended would replace a newer run's findings
		if err := held(ctx, tx); err != nil {
			return err
		}
		// a mismatch the last run did not find is notified, once per
		// episode, in the transaction that stores it
		if err := HostKeyMismatchEvents(ctx, tx, mismatch); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM intake_finding WHERE partner_id = $1`, id); err != nil {
			return err
		}
		if err := fault.Check("reconcile:store"); err != nil {
			return err
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"intake_finding"},
			[]string{"partner_id", "kind", "intake_id", "path", "action", "needs_human", "detail", "run_at"},
			pgx.CopyFromSlice(len(fs), func(i int) ([]any, error) {
				f := fs[i]
				var intakeID any
				if f.IntakeID != 0 {
					intakeID = f.IntakeID
				}
				return []any{id, f.Kind, intakeID, storable(f.Path), storable(f.Action), f.NeedsHuman, storable(f.Detail), now}, nil
			}))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO intake_reconcile_run (partner_id, run_at, findings) VALUES ($1, $2, $3)
			ON CONFLICT (partner_id) DO UPDATE SET run_at = $2, findings = $3`, id, now, len(fs))
		return err
	})
}

// storable is s as a PostgreSQL text column holds it: as it is when it is
// UTF-8 without NUL, else its printable form (internal/inert). Such a
// text is shown escaped once more where it is printed (\\xff for the
// byte 0xff).
func storable(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return inert.Text(s)
}
