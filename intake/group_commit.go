package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// commit is the group's transaction: the files, spooled and each the
// owner of its batch (fetch), have their rows written (one COPY for all
// of them while their keys are new, else each file's merge in id order),
// their ledger rows and their totals, and move to applied.
func (g *fileGroup) commit(ctx context.Context, tgt *target.Table) error {
	began := time.Now() // before the transaction's now(), which renews the owners' leases
	tx, err := g.d.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("group begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	owners := g.files
	for _, f := range owners {
		f.c = chunkCounts{} // a commit tried again after a refused file counts afresh
	}
	if err := g.writeRows(ctx, tx, tgt, owners); err != nil {
		return err
	}
	gs := make([]ledger.GroupFile, len(owners))
	for i, f := range owners {
		f.c.unchanged = int64(f.ch.rows()) - f.c.applied - f.c.conflict
		gs[i] = ledger.GroupFile{In: f.r.in, First: f.ch.first, Last: f.ch.last,
			Applied: f.c.applied, Unchanged: f.c.unchanged, Conflict: f.c.conflict}
	}
	n, err := g.d.ledger.AppliedGroup(ctx, tx, gs, owners[0].r.feed.Hash())
	if err != nil {
		return err
	}
	if n != len(owners) {
		// a file fenced out since fetch: nothing of the group commits, and
		// its files go on alone, where the fence shows
		return fmt.Errorf("group: %d of %d files moved to applied", n, len(owners))
	}
	if err := commitRows(ctx, tx, owners[0].r.in.ID, 0, "group"); err != nil {
		return err
	}
	for _, f := range owners {
		in := f.r.in
		in.State, in.ChunksDone = ledger.StateApplied, 1
		in.RowsTotal = int64(f.ch.rows())
		in.RowsApplied, in.RowsUnchanged, in.RowsConflict = f.c.applied, f.c.unchanged, f.c.conflict
		countRows(g.d.metrics, in.Partner, f.c)
	}
	g.committedAt = began
	return nil
}

// writeRows writes the owners' rows: one COPY straight into the target
// under a savepoint, each row with its own file's intake id, while no key
// repeats across the files (and the target is not StagedDirect); when the target refuses that (a key exists),
// or keys repeat, each file's chunk goes through the staging table and
// the guarded merge, in intake id order, as the per-file path would.
func (g *fileGroup) writeRows(ctx context.Context, tx pgx.Tx, tgt *target.Table, owners []*groupFile) error {
	seen := map[uint64]bool{}
	repeat := false
	for _, f := range owners {
		for k := range f.ch.Keys.All() {
			if seen[k] {
				repeat = true
			}
			seen[k] = true
		}
	}
	// A guarded target whose hash the server computes (StagedDirect: no
	// COPY straight in; with intake's hash each row carries its own), and
	// an update_only feed writes no new key: each file is merged.
	if !repeat && !tgt.StagedDirect() && tgt.Direct() {
		if _, err := tx.Exec(ctx, "SAVEPOINT intake_direct"); err != nil {
			return fmt.Errorf("group savepoint: %w", err)
		}
		var payload []byte
		if tgt.Binary() {
			payload = target.AppendCopyHeader(payload)
		}
		for _, f := range owners {
			payload = f.ch.AppendDirect(payload, g.p.cfg.ID, f.r.in.ID)
		}
		if tgt.Binary() {
			payload = target.AppendCopyTrailer(payload)
		}
		_, err := tgt.CopyDirect(ctx, tx, payload)
		if err == nil {
			for _, f := range owners {
				f.c.applied = int64(f.ch.rows())
			}
			return nil
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("group copy: %w", err)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT intake_direct"); err != nil {
			return fmt.Errorf("group rollback to savepoint: %w", err)
		}
	}
	if err := tgt.Stage(ctx, tx); err != nil {
		return fmt.Errorf("group stage: %w", err)
	}
	// what each file's merge claims rows below (applyStage.claimBelow):
	// the files older than the whole group, looked up once; the group's
	// own files commit together, in id order, and never after each other
	var older int64
	if tgt.Claims() && len(owners) > 0 {
		var err error
		if older, err = ledger.OlderWriter(ctx, tx, g.p.cfg.ID, g.p.cfg.FeedsOn(owners[0].r.feed.Target), owners[0].r.in.ID); err != nil {
			return err
		}
	}
	for i, f := range owners {
		if i > 0 {
			if err := tgt.ClearStage(ctx, tx); err != nil {
				return fmt.Errorf("group stage: %w", err)
			}
		}
		st := f.r.applyStage()
		st.older, st.olderLooked = older, true
		_, err := st.writeRows(ctx, tx, tgt, f.ch, &rowWrite{tx: groupTx}, f.r.in.ID, &f.c)
		if refusedRows(err) != nil || errors.Is(err, errKeyRepeated) {
			return &refusedFileError{file: f, err: err}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// refusedFileError: the target refused a value of one file of the group
// (a CHECK, a foreign key, a length: SQLSTATE class 22 or 23), or the
// file repeats a key the target compares its own way (errKeyRepeated).
// The group's transaction is rolled back; the file goes on alone, where
// the refused rows are found and rejected (the repeated key's earlier
// lines), and the others commit again without it.
type refusedFileError struct {
	file *groupFile
	err  error
}

// errKeyRepeated: the dedupe of a group file's rows dropped lines whose
// key a later line repeats in other bytes (a target that compares keys
// its own way, target/keys.go): those lines are the file's rejects, which
// the file reports alone.
var errKeyRepeated = errors.New("a key repeats within the file as the target compares keys")

// Error names the refusal by its codes: PostgreSQL's own text may quote
// the value.
func (e *refusedFileError) Error() string {
	if errors.Is(e.err, errKeyRepeated) {
		return fmt.Sprintf("intake %d: %v", e.file.r.in.ID, errKeyRepeated)
	}
	return fmt.Sprintf("intake %d: the target refused a value: %s", e.file.r.in.ID, pgerr.Redact(e.err))
}

// reason is the group's leave reason for the file.
func (e *refusedFileError) reason() string {
	if errors.Is(e.err, errKeyRepeated) {
		return LeftRepeatedKey
	}
	return LeftRefused
}

func (e *refusedFileError) Unwrap() error { return e.err }
