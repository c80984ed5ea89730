package ops

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// Approve approves the current plan of a file awaiting approval when
// d.PlanHash is its hash; audited. The daemon polling its partner
// plans it again and applies it only if the plan still has that hash.
func Approve(ctx context.Context, db *pgxpool.Pool, d ledger.PlanDecision) error {
	return ledgerOn(db).Approve(ctx, d)
}

// Reject rejects the plan of a file awaiting approval; audited. The
// daemon polling its partner quarantines it with reason plan_rejected and
// tells the partner.
func Reject(ctx context.Context, db *pgxpool.Pool, d ledger.PlanDecision) error {
	return ledgerOn(db).Reject(ctx, d)
}

// Each read below that takes more than one statement reads one snapshot
// of the ledger (ledger.Snapshot): a count beside its list, a plan beside
// its changes, a file beside its chunks agree however the files move on
// meanwhile.

// HeldPage is a page of the open held files of partners, newest first,
// and how many there are.
func HeldPage(ctx context.Context, db *pgxpool.Pool, partners []string, offset, limit int) (items []ledger.QuarantineItem, total int64, err error) {
	err = ledger.Snapshot(ctx, db, func(l *ledger.Ledger, _ ledger.Reader) error {
		items, total, err = l.HeldPage(ctx, partners, offset, limit)
		return err
	})
	return items, total, err
}

// WaitingPlans is a page of the files of partners awaiting approval and
// how many there are.
func WaitingPlans(ctx context.Context, db *pgxpool.Pool, partners []string, offset, limit int) (ps []ledger.WaitingPlan, total int64, err error) {
	err = ledger.Snapshot(ctx, db, func(l *ledger.Ledger, _ ledger.Reader) error {
		ps, total, err = l.WaitingPlans(ctx, partners, offset, limit)
		return err
	})
	return ps, total, err
}

// PlanPage reads the plan of a file of one of partners, its hash and
// counts (nil: no such file) and, while it awaits approval and limit > 0,
// a page of its changes (ledger.PlanChangePage) beside it: the changes
// are that plan's.
func PlanPage(ctx context.Context, db *pgxpool.Pool, id int64, partners []string, f ledger.ChangeFilter, after, before int64, limit int) (v *ledger.PlanView, rows []ledger.PlanChangeRow, err error) {
	err = ledger.Snapshot(ctx, db, func(l *ledger.Ledger, _ ledger.Reader) error {
		if v, err = l.GetPlan(ctx, id, partners); err != nil || v == nil || limit <= 0 || v.State != string(ledger.StateAwaitingApproval) {
			return err
		}
		rows, err = l.PlanChangePage(ctx, id, partners, f, after, before, limit)
		return err
	})
	return v, rows, err
}

// Story reads one file's record of one of partners (nil: none).
func Story(ctx context.Context, db *pgxpool.Pool, id int64, partners []string) (st *ledger.FileStory, err error) {
	err = ledger.Snapshot(ctx, db, func(l *ledger.Ledger, _ ledger.Reader) error {
		st, err = l.Story(ctx, id, partners)
		return err
	})
	return st, err
}

// AuditPage is a page of the audit rows of partners that f lets
// through, newest first.
func AuditPage(ctx context.Context, db *pgxpool.Pool, partners []string, f ledger.AuditFilter, offset, limit int) ([]ledger.AuditEntry, error) {
	return ledgerOn(db).AuditPage(ctx, partners, f, offset, limit)
}
