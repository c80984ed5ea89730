package intake

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/internal/fault"
)

// commitRows commits a transaction that wrote a file's rows with their
// ledger rows: a chunk of one file (apply.go), the chunks applied ahead of
// the plan (ahead.go) or a group of small files (group_commit.go). Every
// apply commits here, so the crash tests' commit faults sit in this one
// place:
//
//   - apply:mid_chunk: the rows and ledger rows are written, not committed
//   - commit:lost: the COMMIT never reaches the server
//   - commit:reply_lost: it committed, and its reply is lost
//
// A COMMIT the server answered with an error rolled back: that error is
// returned, wrapped with what. Any other failure of the COMMIT (a timeout,
// a lost connection) leaves its outcome unknown: a *CommitUnknownError
// naming id and chunk (the last chunk in the transaction; 0 for a group,
// named by its first file), which only the ledger can resolve.
func commitRows(ctx context.Context, tx pgx.Tx, id int64, chunk int, what string) error {
	if err := fault.Check("apply:mid_chunk"); err != nil {
		return err
	}
	if err := fault.Check("commit:lost"); err != nil {
		return &CommitUnknownError{IntakeID: id, Chunk: chunk, Err: err}
	}
	if err := tx.Commit(ctx); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s commit: %w", what, err) // the server answered: rolled back
		}
		return &CommitUnknownError{IntakeID: id, Chunk: chunk, Err: err}
	}
	if err := fault.Check("commit:reply_lost"); err != nil {
		return &CommitUnknownError{IntakeID: id, Chunk: chunk, Err: err}
	}
	return nil
}

// CommitUnknownError: COMMIT was sent but no answer came back (timeout,
// connection lost). The chunk may or may not be in; only the ledger can
// tell, so the file goes to outcome_unknown instead of a blind retry.
type CommitUnknownError struct {
	IntakeID int64
	Chunk    int
	Err      error
}

func (e *CommitUnknownError) Error() string {
	return fmt.Sprintf("intake %d: commit of chunk %d has an unknown outcome: %v", e.IntakeID, e.Chunk, e.Err)
}

func (e *CommitUnknownError) Unwrap() error { return e.Err }
