package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/reason"
)

// A released file held again records what its new hold knows: held
// first before it was read (too large: no sha256, no batch id), then,
// released and read, held for another reason, its quarantine record
// names its bytes and batch, as `intake quarantine list/show` prints them.
// The record kept the first hold's empty ones.
func TestAFileHeldAgainRecordsWhatItsNewHoldKnows(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	in := r.claim()
	r.finish(in, ledger.StateQuarantined, reason.FileTooLarge)
	r.must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ledger.Reopen(ctx, tx, in.ID, ledger.StateClaimed, ledger.OverrideSize, in.ClaimedPath, "")
		return err
	}))
	got, err := l.Get(ctx, ltPartner, in.ID)
	r.must(err)
	r.spool(got)
	r.finish(got, ledger.StateQuarantined, reason.RejectRate)
	var sha, batch, why string
	r.must(pool.QueryRow(ctx, `SELECT coalesce(content_sha256, ''), coalesce(batch_id, ''), reason FROM intake_quarantine WHERE intake_id = $1`, in.ID).
		Scan(&sha, &batch, &why))
	if sha != got.SHA256 || batch != got.BatchID || why != string(reason.RejectRate) || sha == "" {
		t.Fatalf("quarantine record: sha256 %q, batch %q, reason %s; want %q, %q, %s", sha, batch, why, got.SHA256, got.BatchID, reason.RejectRate)
	}
}
