package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/reason"
)

// A discard keeps the receipt its hold published on the row and marks
// its own as due (CloseHeld): the reconciler finds it (Undecided) until
// its receipt is recorded. A discard recorded the way an older intake
// binary records it (the path cleared, nothing marked), as one still
// running beside this one during an upgrade does, is found too.
func TestADiscardIsUndecidedUntilItsReceiptIsRecorded(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	held := func() *ledger.Intake {
		in := r.claim()
		in.ReceiptPath = "/old-reports/held.receipt.json"
		r.finish(in, ledger.StateQuarantined, reason.FileTooLarge)
		return in
	}
	undecided := func() []int64 {
		rows, err := l.Undecided(ctx, ltPartner)
		r.must(err)
		var ids []int64
		for _, in := range rows {
			if !in.DiscardUnpublished() {
				t.Errorf("intake %d listed undecided but says it is published: %+v", in.ID, in)
			}
			ids = append(ids, in.ID)
		}
		return ids
	}

	a := held()
	r.must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ledger.CloseHeld(ctx, tx, a.ID, "discarded")
		return err
	}))
	got, err := l.Get(ctx, ltPartner, a.ID)
	r.must(err)
	if ids := undecided(); len(ids) != 1 || ids[0] != a.ID || got.ReceiptPath != "/old-reports/held.receipt.json" || !got.ReceiptPending {
		t.Fatalf("undecided %v, row %+v: want intake %d pending with the hold's receipt kept", ids, got, a.ID)
	}
	r.must(l.RecordDiscardReceipt(ctx, got, "/reports/discarded.receipt.json"))
	if ids := undecided(); len(ids) != 0 {
		t.Fatalf("undecided %v after the discard's receipt was recorded, want none", ids)
	}

	b := held()
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET state = 'discarded', fencing_token = fencing_token + 1, worker_id = 'discarded',
		receipt_path = NULL WHERE intake_id = $1`, b.ID); err != nil {
		t.Fatal(err)
	}
	if ids := undecided(); len(ids) != 1 || ids[0] != b.ID {
		t.Fatalf("undecided %v, want intake %d, discarded the earlier way", ids, b.ID)
	}
}
