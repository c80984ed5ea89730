package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// OlderWriter names the newest older file of the feed that may still
// write rows: one not yet applied, or held for a reason ops may release;
// not a file archived, discarded, of another feed, newer than the place,
// nor held for a reason that can only be discarded. A replay counts at
// the place of the file it replays.
func TestOlderWriterNamesOnlyFilesThatMayStillWrite(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	// states set as they stand, not walked to (the transition guard off)
	exec := func(sql string, args ...any) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql, args...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	set := func(in *ledger.Intake, state, why string) {
		t.Helper()
		exec(`UPDATE file_intake SET state = $2, reason = nullif($3, '') WHERE intake_id = $1`, in.ID, state, why)
	}
	older := func(place int64) int64 {
		t.Helper()
		got, err := ledger.OlderWriter(ctx, pool, ltPartner, []string{"orders"}, place)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	held, waiting, archived, changed := r.claim(), r.claim(), r.claim(), r.claim()
	set(held, "quarantined", "reject_rate")
	set(waiting, "awaiting_approval", "awaiting_approval")
	set(archived, "archived", "")
	set(changed, "quarantined", "changed_after_claim")
	newest := r.claim()
	if got := older(newest.ID); got != waiting.ID {
		t.Fatalf("older writer below %d: %d, want the file awaiting approval %d", newest.ID, got, waiting.ID)
	}
	if got := older(waiting.ID); got != held.ID {
		t.Fatalf("older writer below %d: %d, want the held file %d", waiting.ID, got, held.ID)
	}
	set(waiting, "discarded", "")
	set(held, "quarantined", "changed_after_claim")
	if got := older(newest.ID); got != 0 {
		t.Fatalf("older writer below %d: %d, want none (archived, discarded, held only to be discarded)", newest.ID, got)
	}
	// a replay of the archived file, not yet applied, stands at its place
	exec(`UPDATE file_intake SET replay_of = $2, state = 'spooled' WHERE intake_id = $1`, newest.ID, archived.ID)
	later := r.claim()
	if got := older(later.ID); got != archived.ID {
		t.Fatalf("older writer below %d: %d, want the replay's place %d", later.ID, got, archived.ID)
	}
}
