package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// A poll resumes only the rows its worker still holds: a row its worker
// listed as due that another worker took over meanwhile (the file moved
// into that worker's processing dir), and whose lease then ran out (the
// taker stalled), is left to the reconciler's takeover, which moves the
// file. Resumed, it ran at the other worker's path, where the stalled
// taker may still act on it.
func TestAResumeTakesOnlyItsOwnWorkersRow(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	in := r.claim() // worker w1
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET worker_id = 'w2', fencing_token = fencing_token + 1,
		claimed_path = '/processing/w2/' || remote_name, lease_until = pg_catalog.now() - interval '1 minute'
		WHERE intake_id = $1`, in.ID); err != nil {
		t.Fatal(err)
	}
	var fe *ledger.FencedError
	if got, err := l.Resume(ctx, in.ID, "w1"); !errors.As(err, &fe) {
		t.Fatalf("w1 resumed w2's row with its lease run out: %+v, %v; want a FencedError", got, err)
	}
	got, err := l.Resume(ctx, in.ID, "w2")
	if err != nil || got.Worker != "w2" || got.Token != in.Token+2 {
		t.Fatalf("w2 resuming its own row: %+v, %v", got, err)
	}
}
