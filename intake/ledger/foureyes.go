package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// sameHands refuses, when d or the database (intake_ops_policy, set by
// `intake grants`) asks for four eyes, the approval of a file by the
// database login role (session_user) that released it from quarantine or
// requested it as a replay: the audit records both with their db_user
// (migration 016). A rejection is never refused: it applies nothing. Rows
// recorded before db_user was have none, and refuse nobody. It reads in
// tx, ahead of the decision's statement: a release or replay is audited
// in the transaction that makes the file, so no later one can slip in
// between. The database's rule binds the ops role whatever this says (a
// restrictive policy of grants.sql); this check names the reason first.
func sameHands(ctx context.Context, tx pgx.Tx, d PlanDecision, decision string) error {
	if decision != "approved" {
		return nil
	}
	var who, action string
	err := tx.QueryRow(ctx, `SELECT a.db_user, a.action FROM intake_audit a
		WHERE a.intake_id = $1 AND a.action IN ('release', 'replay') AND a.db_user = session_user
		  AND ($2::bool OR (SELECT p.four_eyes FROM intake_ops_policy p))
		ORDER BY a.audit_id DESC LIMIT 1`, d.IntakeID, d.FourEyes).Scan(&who, &action)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("four eyes: %w", err)
	}
	verb := map[string]string{"release": "released it from quarantine", "replay": "requested it as a replay"}[action]
	return fmt.Errorf("%w: four eyes (ops.four_eyes, or intake grants --four-eyes): database user %s %s; another person must approve it",
		ErrPlanDecision, who, verb)
}
