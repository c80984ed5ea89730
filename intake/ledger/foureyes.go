package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// sameHands refuses, when d or the database (intake_ops_policy, set by
// `intake grants`) asks for four eyes, the approval of a file by whoever
// released it from quarantine or requested it as a replay. Who that is:
//
//   - on the CLI, the database login role (session_user): the audit
//     records it as db_user (migration 016), and --actor is only a claim;
//   - on the console (d.SharedLogin), whose one login is the daemon's,
//     the signed-in actor: the audit's actor of the release or replay,
//     whichever way it was made.
//
// A rejection is never refused: it applies nothing. Rows recorded before
// db_user was have none, and refuse no login. It reads in tx, ahead of the
// decision's statement: a release or replay is audited in the transaction
// that makes the file, so no later one can slip in between. The
// database's rule binds the ops role whatever this says (a restrictive
// policy of grants.sql); this check names the reason first, and is the
// rule for the console, whose login is not the ops role.
func sameHands(ctx context.Context, tx pgx.Tx, d PlanDecision, decision string) error {
	if decision != "approved" {
		return nil
	}
	var who, action string
	err := tx.QueryRow(ctx, `SELECT CASE WHEN $3 THEN 'actor ' || a.actor ELSE 'database user ' || a.db_user END, a.action FROM intake_audit a
		WHERE a.intake_id = $1 AND a.action IN ('release', 'replay')
		  AND (CASE WHEN $3 THEN a.actor = $4 ELSE a.db_user = session_user END)
		  AND ($2::bool OR (SELECT p.four_eyes FROM intake_ops_policy p))
		ORDER BY a.audit_id DESC LIMIT 1`, d.IntakeID, d.FourEyes, d.SharedLogin, d.Actor).Scan(&who, &action)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("four eyes: %w", err)
	}
	verb := map[string]string{"release": "released it from quarantine", "replay": "requested it as a replay"}[action]
	return fmt.Errorf("%w: four eyes (ops.four_eyes, or intake grants --four-eyes): %s %s; another person must approve it",
		ErrPlanDecision, who, verb)
}
