package ops

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// PlanView is a file's plan as `intake plan show` prints it.
type PlanView = ledger.PlanView

// PlanDecision is an approve or reject of a waiting plan.
type PlanDecision = ledger.PlanDecision

// ErrPlanDecision: an approve or reject that cannot be made.
var ErrPlanDecision = ledger.ErrPlanDecision

// ShowPlan reads the plan of a file of one of partners (nil: no such file).
func ShowPlan(ctx context.Context, db *pgxpool.Pool, id int64, partners []string) (*PlanView, error) {
	return ledgerOn(db).GetPlan(ctx, id, partners)
}

// Approve approves the current plan of a file awaiting approval when
// d.PlanHash is its hash; audited. The daemon polling its partner
// plans it again and applies it only if the plan still has that hash.
func Approve(ctx context.Context, db *pgxpool.Pool, d PlanDecision) error {
	return ledgerOn(db).Approve(ctx, d)
}

// Reject rejects the plan of a file awaiting approval; audited. The
// daemon polling its partner quarantines it with reason plan_rejected and
// tells the partner.
func Reject(ctx context.Context, db *pgxpool.Pool, d PlanDecision) error {
	return ledgerOn(db).Reject(ctx, d)
}
