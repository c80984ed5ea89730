package ops

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// ShowPlan reads the plan of a file of one of partners, its hash and
// counts (nil: no such file); its changes are PlanChangePage's.
func ShowPlan(ctx context.Context, db *pgxpool.Pool, id int64, partners []string) (*ledger.PlanView, error) {
	return ledgerOn(db).GetPlan(ctx, id, partners)
}

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

// HeldPage is a page of the open held files of partners, newest first,
// and how many there are.
func HeldPage(ctx context.Context, db *pgxpool.Pool, partners []string, offset, limit int) ([]ledger.QuarantineItem, int64, error) {
	return ledgerOn(db).HeldPage(ctx, partners, offset, limit)
}

// WaitingPlans is a page of the files of partners awaiting approval and
// how many there are.
func WaitingPlans(ctx context.Context, db *pgxpool.Pool, partners []string, offset, limit int) ([]ledger.WaitingPlan, int64, error) {
	return ledgerOn(db).WaitingPlans(ctx, partners, offset, limit)
}

// PlanChangePage is a page of a file's plan changes (ledger.PlanChangePage).
func PlanChangePage(ctx context.Context, db *pgxpool.Pool, id int64, partners []string, f ledger.ChangeFilter, after, before int64, limit int) ([]ledger.PlanChangeRow, error) {
	return ledgerOn(db).PlanChangePage(ctx, id, partners, f, after, before, limit)
}

// Story reads one file's record of one of partners (nil: none).
func Story(ctx context.Context, db *pgxpool.Pool, id int64, partners []string) (*ledger.FileStory, error) {
	return ledgerOn(db).Story(ctx, id, partners)
}

// AuditPage is a page of the audit rows of partners that f lets
// through, newest first.
func AuditPage(ctx context.Context, db *pgxpool.Pool, partners []string, f ledger.AuditFilter, offset, limit int) ([]ledger.AuditEntry, error) {
	return ledgerOn(db).AuditPage(ctx, partners, f, offset, limit)
}
