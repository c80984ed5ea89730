package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// Chunks applied ahead by a worker that lost the file (another took it
// over and committed its first chunk) end with a FencedError: the chunk
// rows sent behind the closed gate fail on the other worker's and abort
// the transaction, so why the gate closed is read outside it. Read in it,
// the worker logged "current transaction is aborted" and took the loss
// for a failure of its own.
func TestChunksAppliedAheadOfAFileTakenOverAreFenced(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	in := r.reach(ledger.StateApplying)
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET fencing_token = fencing_token + 1, worker_id = 'w2', chunks_done = 1
		WHERE intake_id = $1`, in.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO intake_chunk (intake_id, chunk_no, partner_id, first_line, last_line,
		rows_applied, rows_unchanged, rows_conflict, fencing_token) VALUES ($1, 0, $2, 1, 10, 10, 0, 0, $3)`, in.ID, in.Partner, in.Token+1); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = l.ChunksDone(ctx, tx, in, []ledger.Chunk{{No: 0, First: 1, Last: 10, Applied: 10}})
	var fe *ledger.FencedError
	if !errors.As(err, &fe) {
		t.Fatalf("got %v, want a FencedError", err)
	}
}
