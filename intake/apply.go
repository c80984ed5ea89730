package intake

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/spool"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/chunkrows"
	"github.com/partner-intake/partner-intake/intake/holdback"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
)

// chunkCounts is what one chunk transaction did.
type chunkCounts struct {
	applied, unchanged, rejected, conflict int64
	// of conflict: rows edited outside intake (kept), existing keys of an
	// insert_only feed; of rejected: keys an update_only feed lacks
	outsideEdit, exists, notFound int64
	deleted                       int64 // a snapshot's rows deleted (or marked): not rows of the file
	deleteKept                    int64 // a snapshot's rows not deleted, edited outside intake: not rows of the file
	fileApplied                   bool  // the last chunk moved the file to applied
}

// applyStage is a file's apply: its chunks, how their rows reach the
// target, and the rows the target refuses. A run makes one for its
// applying step, the apply ahead of the plan one of its own (ahead.go),
// and a group one for each file it merges (group_commit.go). What it
// holds is the apply's alone; the file's row and its run are the
// fileRun's.
type applyStage struct {
	*fileRun
	// direct: the next chunk is tried straight into the target (see
	// writeRows).
	direct bool
	// unchangedPause: chunks to merge whole before the next look-up of
	// rows the target holds as they are (toMerge).
	unchangedPause int
	// older: the place of the newest older file of the feed that may
	// still write rows (claimBelow; 0: none), once olderLooked
	older       int64
	olderLooked bool
	// held: the keys a replay holds back (intake/holdback; nil: none)
	held *holdback.Keys
}

// claimBelow is what the merge claims rows below (target.Merge): the
// place of the newest older file of the feed that may still write rows,
// looked up at the apply's first merge; 0 when there is none or the
// feed's merge never claims. A row a file finds as it says keeps the
// last_intake_id of the intake that wrote it, so an older file applied
// later (files of a feed run side by side; one held, released or replayed
// after) would overwrite it; claimed, it meets the newer write.
func (r *applyStage) claimBelow(ctx context.Context, tx pgx.Tx, tgt *target.Table, writer int64) (int64, error) {
	if !tgt.Claims() {
		return 0, nil
	}
	if !r.olderLooked {
		older, err := ledger.OlderWriter(ctx, tx, r.in.Partner, r.p.cfg.FeedsOn(r.feed.Target), writer)
		if err != nil {
			return 0, err
		}
		r.older, r.olderLooked = older, true
	}
	return r.older, nil
}

// applyStage starts the file's apply.
func (r *fileRun) applyStage() *applyStage { return &applyStage{fileRun: r} }

// apply merges the valid rows of a planned file into the target, chunk by
// chunk. Chunk n is always the same range of data rows (the spooled bytes
// are immutable), so after a crash or takeover it resumes after the last
// chunk the ledger holds. Each chunk is one transaction: the fencing gate,
// the rows (straight into the target while they are all new, else COPY
// into a staging table and one set-based guarded upsert), the ledger row
// and the file's progress.
//
// One goroutine reads and encodes chunk n+1 while the database applies
// chunk n (two chunk buffers: memory stays flat in file size).
func (r *applyStage) apply(ctx context.Context) error {
	in := r.in
	if done, err := r.frozenMapping(ctx); done || err != nil {
		return err
	}
	tgt, err := r.targetTable(ctx)
	if err != nil {
		return err
	}
	if in.ChunksDone == 0 && in.ApprovedPlanHash != "" {
		if err := fault.Check("approval:before_first_chunk"); err != nil {
			return err
		}
	}
	if r.ahead != nil {
		// chunks applied while the file downloaded wait for this moment
		// (ahead.go); when they cannot be used, the spool path below
		// applies the file as if they never were
		if done, err := r.applyAhead(ctx, tgt); done {
			return err
		}
	}
	if in.ReplayOf != 0 {
		// what a replay holds back: rows a newer file of the table named
		r.held, err = holdback.Look(ctx, holdback.Replay{DB: r.d.db, Spool: r.d.spool, Partner: r.p.cfg, Feed: r.feed, In: in,
			Site: r.sess, MinFree: r.d.cfg.SpoolMinFree, Drop: func(e spool.Entry) { r.dropUnused(e, "a copy made to read a newer file") }, Log: r.log})
		if err != nil {
			return err
		}
	}
	if err := r.fetchStage().ensureSpooled(ctx); err != nil || in.State != ledger.StateApplying {
		return err
	}
	f, rd, err := r.spooledRows("apply")
	if err != nil {
		return err
	}
	defer f.Close()
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	full := make(chan *chunk, 1)
	free := make(chan *chunk, 2)
	rowsPerChunk := int(min(int64(r.feed.ChunkRows), max(in.RowsTotal, 1)))
	seed := maphash.MakeSeed()
	for range 2 {
		free <- newChunk(seed, rowsPerChunk, tgt)
	}
	readErr := make(chan error, 1)
	first := in.ChunksDone // the reader must not read in while the loop below writes it
	go func() { readErr <- r.readChunks(pctx, rd, first, full, free, nil) }()
	r.direct = tgt.Direct() // optimistic: fresh rows go straight into the target
	return r.applyChunks(ctx, tgt, nil, full, free, readErr, cancel)
}

// applyChunks commits the chunks the reader hands over (pending first,
// when not nil) one transaction each, then moves the file to applied.
// cancel stops the reader.
func (r *applyStage) applyChunks(ctx context.Context, tgt *target.Table, pending *chunk, full <-chan *chunk, free chan<- *chunk, readErr <-chan error, cancel func()) error {
	in := r.in
	next := func() (*chunk, bool) {
		if c := pending; c != nil {
			pending = nil
			return c, true
		}
		c, ok := <-full
		return c, ok
	}
	for c, ok := next(); ok; c, ok = next() {
		if err := r.commitChunk(ctx, tgt, c); err != nil {
			cancel()
			for range full { // let the reader finish
			}
			<-readErr
			var pc *planChangedError
			if errors.As(err, &pc) {
				return r.rewait(ctx, pc)
			}
			var se *supersededError
			if errors.As(err, &se) {
				return r.supersede(ctx, ledger.StateApplying, se.newer)
			}
			if errors.Is(err, errChangedBeforeCommit) {
				return r.hold(ctx, ledger.StateQuarantined, reason.ChangedAfterClaim, 0, fmt.Sprintf(
					"the file changed after it was claimed (the partner was still writing it), found right before its last commit; %d of its chunks were applied before. Publish the complete file again under a new name", in.ChunksDone))
			}
			return err
		}
		if in.State == ledger.StateOutcomeUnknown {
			// the commit's outcome was lost and recorded (markUnknown): the
			// reconciler reads the ledger and resumes the file after the
			// chunks that are in; this run stops here
			cancel()
			for range full {
			}
			<-readErr
			return nil
		}
		free <- c
	}
	if err := <-readErr; err != nil {
		return err
	}
	return endApply(ctx, r.d, r.fileRun)
}

// endApply is the end of the apply stage, for one file or a group's:
// every file applied (MarkApplied for one whose last commit did not move
// it: nothing left to apply, no rows or all applied before a restart; a
// group's transaction moved its files). From here a crash leaves the
// files applied, archived on resume without applying anything again
// (failure matrix row 10).
func endApply(ctx context.Context, d *Daemon, runs ...*fileRun) error {
	for _, r := range runs {
		if r.in.State != ledger.StateApplied {
			if err := d.ledger.MarkApplied(ctx, r.in); err != nil {
				return err
			}
		}
	}
	return fault.Check("apply:after_commit")
}

// readChunks reads the spooled rows from the first chunk not yet in the
// ledger on and hands full chunks over; it closes full when done.
//
// A chunk ends at chunk_rows rows or before the row that would take its
// values past chunk_bytes, whichever comes first (chunkCut): the cut
// points are a function of the spooled bytes and the feed alone, so chunk
// n is the same rows on every run and the ledger's chunk numbers hold
// across resumes. A chunk is handed over once the next chunk's first row
// (or the end of the file) is read, so the last one knows it is last.
//
// sc, when not nil, is the plan's scan, made in the same pass (ahead.go):
// every row counted, the rejected ones kept as scanRows keeps them.
func (r *applyStage) readChunks(ctx context.Context, rd *rows.Reader, first int, full chan<- *chunk, free <-chan *chunk, sc *scan) error {
	defer close(full)
	keyIdx := keyIndexes(r.feed)
	var cut chunkrows.Cut
	var c *chunk
	take := func(no int) error {
		select {
		case c = <-free:
			c.reset(no)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	hand := func(final bool) error {
		c.final = final
		select {
		case full <- c:
			c = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		row, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if sc != nil && !errors.As(err, &sc.fail) {
				sc.err = err
			}
			return fmt.Errorf("apply: spooled file no longer reads as planned: %w", err)
		}
		if sc != nil {
			sc.count(row)
		}
		no, next := cut.Place(r.feed, row)
		if next && c != nil {
			if err := hand(false); err != nil {
				return err
			}
		}
		if no < first {
			continue
		}
		if c == nil {
			if err := take(no); err != nil {
				return err
			}
		}
		c.span(row.Line)
		if row.Issue == nil && r.held.Holds(r.feed, row) {
			c.heldBack = append(c.heldBack, row.Line)
			continue
		}
		if row.Issue == nil {
			if err := c.Add(row.Line, row.Values, row.Null, keyIdx); err != nil {
				// a value the target column's binary encoding refuses (an
				// integer past a smallint, a decimal past the column's
				// precision): that row alone is refused
				var ve *chunkrows.ValueError
				if !errors.As(err, &ve) {
					return err
				}
				c.refused = append(c.refused, refusal{line: row.Line, column: r.feed.Columns[ve.Col].Name, detail: "refused by the column's type: " + ve.Code})
			}
		}
	}
	if c != nil {
		return hand(true)
	}
	return nil
}

// keyIndexes are the positions of the feed's key columns in its rows.
func keyIndexes(f *partners.Feed) []int {
	var keyIdx []int
	for i, c := range f.Columns {
		if slices.Contains(f.Key, c.Name) {
			keyIdx = append(keyIdx, i)
		}
	}
	return keyIdx
}

// markUnknown records that a commit's outcome is unknown. The reconciler
// resolves it from the ledger; nothing is retried blindly. If even this
// write fails, the row stays in applying and whoever resumes it reads the
// ledger through the chunk gate, which is the same resolution. The episode
// counts as an attempt of the file (MarkUnknown): past the retry budget,
// the run that takes the file up after the resolution ends it (endSpent),
// so a COMMIT whose reply is lost every time cannot cycle for ever.
func (r *applyStage) markUnknown(ctx context.Context, cu *CommitUnknownError) error {
	r.log.Warn("commit outcome unknown; the reconciler will read the ledger", "chunk", cu.Chunk, "err", cu.Err)
	// The run's context may be what cut the commit short; this write must
	// still be attempted, so it gets its own bounded context.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	retry := r.d.cfg.Retry
	n, spent, err := r.d.ledger.MarkUnknown(wctx, r.in, pgerr.Redact(cu), retry.Base, retry.Max, retry.Attempts, retry.Within)
	if errors.Is(err, ledger.ErrCommitLanded) {
		// the last chunk's commit moved the file to applied: the ledger
		// says it landed, and the run goes on from there
		r.log.Info("the commit's reply was lost, and the ledger says it landed: the file is applied", "chunk", cu.Chunk)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w (and recording outcome_unknown failed: %v)", cu, err)
	}
	if spent {
		r.log.Error("file past its retry budget with a commit outcome unknown; it fails for good once the reconciler has read the ledger", "attempts", n)
	}
	r.d.metrics.Finished(r.in.Partner, string(ledger.StateOutcomeUnknown))
	return nil
}

// endSpent fails a file taken up past its retry budget with reason
// retries_exhausted, without running it again: its last attempt ended
// without knowing whether its commit landed, and the reconciler has since
// read the ledger and put it back (ResolveUnknown); or the hold that
// should have ended it failed (MarkSpent). Its committed chunks stay
// applied; its row and receipt count them.
func (r *fileRun) endSpent(ctx context.Context) error {
	r.log.Error("file failed past its retry budget", "attempts", r.in.Attempts)
	r.redecided = true // an earlier hold may have published under another name
	return r.hold(ctx, ledger.StateFailedTerminal, reason.RetriesExhausted, 0, r.spentDetail(r.in.Attempts, ""))
}

// spentDetail is what the receipt of a file past its retry budget says:
// its attempts, the last error's codes (lastCodes), and the rows of it
// that were applied before it stopped, which stay applied.
func (r *fileRun) spentDetail(attempts int, codes string) string {
	if r.in.ChunksDone > 0 {
		return fmt.Sprintf("the file could not be processed in %d attempts%s; %d of its rows were applied before it stopped and stay applied%s; ops have been alerted and can replay it",
			attempts, codes, r.in.RowsApplied, sitefile.AppliedBeforeRelease(r.in, true))
	}
	return fmt.Sprintf("the file could not be processed in %d attempts%s%s; ops have been alerted and can replay it", attempts, codes, sitefile.AppliedBeforeRelease(r.in, false))
}

// commitChunk applies one chunk, retrying transient database errors with
// capped backoff. A retry first reads the ledger through the gate: a chunk
// whose commit did land is never applied again.
func (r *applyStage) commitChunk(ctx context.Context, tgt *target.Table, ch *chunk) error {
	chunk := ch.no
	if ch.final {
		if err := r.stillAsClaimed(ctx); err != nil {
			return err
		}
	}
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		c, err := r.chunkTx(ctx, tgt, ch)
		if err == nil {
			r.account(chunk+1, c)
			return nil
		}
		if errors.Is(err, ledger.ErrChunkDone) {
			r.in.ChunksDone = chunk + 1
			return nil
		}
		var cu *CommitUnknownError
		if errors.As(err, &cu) {
			if err := r.markUnknown(ctx, cu); err != nil || r.in.State != ledger.StateApplied {
				return err
			}
			countRows(r.d.metrics, r.in.Partner, c) // landed: the ledger's counts are in r.in
			return nil
		}
		var pc *planChangedError
		var se *supersededError
		if errors.As(err, &pc) || errors.As(err, &se) {
			return err // nothing written: the file waits again, or ends (applyChunks)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !transient(err) || attempt >= 5 {
			return err
		}
		r.log.Warn("chunk failed, retrying", "chunk", chunk, "attempt", attempt, "err", err)
		r.d.metrics.ChunkRetries.WithLabelValues(r.in.Partner).Inc()
		r.d.signals.ChunkRetry.Signal(r.in.Partner)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(jitter(backoff)):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// account takes what committed chunks did into the file's totals and
// metrics: the ledger now holds chunksDone chunks.
func (r *applyStage) account(chunksDone int, c chunkCounts) {
	r.in.RowsApplied += c.applied
	r.in.RowsUnchanged += c.unchanged
	r.in.RowsRejected += c.rejected
	r.in.RowsConflict += c.conflict
	r.in.RowsDeleted += c.deleted
	r.in.RowsDeleteKept += c.deleteKept
	r.in.ChunksDone = chunksDone
	if c.fileApplied {
		r.in.State = ledger.StateApplied
	}
	countRows(r.d.metrics, r.in.Partner, c)
	if r.progress != nil {
		r.progress(r.in.RowsApplied+r.in.RowsUnchanged+r.in.RowsConflict+r.in.RowsRejected, r.in.RowsTotal)
	}
}

func (r *applyStage) chunkTx(ctx context.Context, tgt *target.Table, ch *chunk) (chunkCounts, error) {
	in, chunk := r.in, ch.no
	var c chunkCounts
	tx, err := r.d.db.Begin(ctx)
	if err != nil {
		return c, fmt.Errorf("chunk %d begin: %w", chunk, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if r.recheckPlan(ch) {
		// an approved plan: planned again in this, the first chunk's,
		// transaction before any row is written (approval.go)
		if err := r.recheck(ctx, tx, tgt); err != nil {
			return c, err
		}
	}
	if err := r.chunkStatements(ctx, tx, tgt, ch, &c); err != nil {
		return c, err
	}
	return c, commitRows(ctx, tx, in.ID, chunk, fmt.Sprintf("chunk %d", chunk))
}

func (r *applyStage) chunkStatements(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, c *chunkCounts) error {
	in, chunk := r.in, ch.no
	path := r.rowPath(ch)
	// The gate: the row lock it takes also blocks a takeover until this
	// transaction ends, and the token check fences a stale owner. It goes
	// out in one round trip with the first statement of the rows' path.
	b := &pgx.Batch{}
	r.d.ledger.QueueChunkGate(b, in, chunk)
	// A chunk may outlast the lease (a slow trigger, rows locked by the
	// application): its statements get their own bound instead of the
	// lease-long statement_timeout of the pool (PoolConfig). The owner is
	// not taken over meanwhile (ClaimLock.TakeOver), and the progress update
	// renews the lease from the moment of commit.
	b.Queue(chunkStatementTimeout)
	if !ch.final {
		// Not the file's last chunk: its commit need not wait for the WAL
		// flush. Rows and ledger row commit together either way, so a
		// database crash can only lose whole chunks, which the ledger
		// then no longer holds and the resumed file applies again; the
		// last chunk commits synchronously, which makes every earlier
		// one durable before the file is applied and archived.
		b.Queue("SET LOCAL synchronous_commit = off")
	}
	lockSnapshot := tgt.Snapshot() && in.Override != OverrideOlder
	if lockSnapshot {
		// the feed's snapshot lock, taken before the savepoint below: one
		// taken inside it would end with a rollback to it (a key the
		// direct path finds there, a refused row), and the rows written
		// after that would commit without it
		ledger.QueueSnapshotLock(b, in.Partner, in.Feed)
	}
	switch path {
	case pathDirect:
		if tgt.StagedDirect() {
			b.Queue(tgt.StageDDL())
		}
		b.Queue("SAVEPOINT intake_direct")
	case pathMerge:
		b.Queue(tgt.StageDDL())
		b.Queue("SAVEPOINT intake_merge") // a refused row rolls back to here (refuse.go)
	}
	br := tx.SendBatch(ctx, b)
	tag, err := br.Exec()
	for i := 1; err == nil && i < b.Len(); i++ {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("chunk %d gate: %w", chunk, err)
	}
	if tag.RowsAffected() == 0 {
		return ledger.ChunkGateClosed(ctx, tx, in, chunk)
	}
	writer := r.writer()
	if lockSnapshot {
		// one feed's snapshots apply in claim order, one at a time:
		// under the feed's lock, a newer one begun or applied ends this
		// one before it writes a row (snapshot.go)
		newer, err := ledger.SupersededBy(ctx, tx, in.Partner, in.Feed, writer, false)
		if err != nil {
			return err
		}
		if newer != 0 {
			return &supersededError{newer: newer}
		}
	}
	staged, err := r.writeRows(ctx, tx, tgt, ch, &rowWrite{tx: chunkTx}, writer, c)
	if err != nil {
		return err
	}
	if err := r.rowsWritten(ctx, tx, tgt, ch, c, staged); err != nil {
		return err
	}
	if tgt.Snapshot() && ch.final {
		if err := r.snapshotSweep(ctx, tx, tgt, writer, c); err != nil {
			return err
		}
	}
	// The ledger row and the file's progress, in one round trip; the last
	// chunk also moves the file to applied when its totals reconcile.
	c.fileApplied, err = r.d.ledger.ChunkDone(ctx, tx, in, ledger.Chunk{No: chunk, First: ch.first, Last: ch.last,
		Applied: c.applied, Unchanged: c.unchanged, Rejected: c.rejected, Conflict: c.conflict, Deleted: c.deleted, DeleteKept: c.deleteKept, Final: ch.final})
	return err
}

// rowsWritten ends a chunk's rows once they are written (writeRows, in
// a chunk's own transaction or ahead of the plan): the rows neither applied, rejected nor
// in conflict are unchanged; the rows refused while encoding (never among
// ch.rows()) are recorded rejected; a snapshot records the keys of the
// chunk's rows from the staging table, which holds them as written
// (staged), so that a snapshot stopped part way resumes with the keys of
// the chunks it committed.
func (r *applyStage) rowsWritten(ctx context.Context, tx pgx.Tx, tgt *target.Table, ch *chunk, c *chunkCounts, staged bool) error {
	c.unchanged = int64(ch.rows()) - c.rejected - c.applied - c.conflict
	if len(ch.refused) > 0 {
		if err := r.recordRefusals(ctx, tx, ch.refused); err != nil {
			return err
		}
		c.rejected += int64(len(ch.refused))
	}
	if len(ch.heldBack) > 0 {
		detail := "a newer file of the table named the key"
		if r.held.Unread() {
			detail = "a newer file of the table named the key, or may have: it could not be read"
		}
		if err := ledger.RecordConflicts(ctx, tx, r.in, reason.NewerWrite, ch.heldBack, detail); err != nil {
			return err
		}
		c.conflict += int64(len(ch.heldBack))
	}
	if tgt.Snapshot() && staged {
		if err := tgt.RecordKeys(ctx, tx, r.in.ID, r.in.Partner); err != nil {
			return fmt.Errorf("chunk %d snapshot keys: %w", ch.no, err)
		}
	}
	return nil
}

// snapshotSweep, in a snapshot's last chunk, deletes or marks the rows
// whose key the file lacks and forgets the keys, in the chunk's
// transaction: a snapshot sweeps exactly once, with its last chunk. A
// snapshot with a rejected row sweeps nothing: that row's key may be one
// the partner still holds. A repeated key's earlier line does not count:
// its key is in the file (the later line), as the plan counts it, and a
// key repeated across chunks is rejected by neither.
func (r *applyStage) snapshotSweep(ctx context.Context, tx pgx.Tx, tgt *target.Table, writer int64, c *chunkCounts) error {
	rejected := r.in.RowsRejected + c.rejected
	if rejected > 0 {
		var err error
		if rejected, err = ledger.RejectedBut(ctx, tx, r.in.ID, reason.DuplicateKey); err != nil {
			return fmt.Errorf("snapshot sweep: %w", err)
		}
	}
	if rejected > 0 {
		r.log.Warn("snapshot has rejected rows: no row deleted", "rows_rejected", rejected)
		r.d.metrics.SnapshotSkipped.WithLabelValues(r.in.Partner).Inc()
	} else {
		n, kept, err := tgt.Sweep(ctx, tx, writer, r.in.Partner, r.in.ID, r.in.Feed)
		if err != nil {
			return fmt.Errorf("snapshot sweep: %w", err)
		}
		c.deleted, c.deleteKept = n, kept
		if kept > 0 {
			r.log.Warn("snapshot kept rows it would delete: edited outside intake", "rows_delete_kept", kept, "reason", reason.OutsideEdit)
		}
	}
	return ledger.ForgetSnapshotKeys(ctx, tx, r.in.ID)
}

// frozenMapping keeps a file on the feed mapping that planned it
// (partners.Feed.Hash): a resume (after a restart, a takeover, a retry)
// that finds another mapping in force plans the file again under it when no chunk is
// applied yet, and otherwise fails it (mapping_changed) rather than apply
// its remaining chunks under another mapping. done: the file's state
// moved and apply must not go on.
func (r *applyStage) frozenMapping(ctx context.Context) (done bool, err error) {
	in := r.in
	if in.FeedSHA256 == "" || r.feed.SameMapping(in.FeedSHA256) {
		return false, nil // planned by this mapping (or before hashes were recorded)
	}
	if in.ChunksDone == 0 {
		r.log.Warn("feed configuration changed since the plan: planning again", "feed", in.Feed)
		return true, ledger.Replan(ctx, r.d.db, in)
	}
	r.log.Warn("feed configuration changed part way through the apply: the file fails", "feed", in.Feed,
		"chunks_done", in.ChunksDone, "reason", reason.MappingChanged)
	return true, r.hold(ctx, ledger.StateFailedTerminal, reason.MappingChanged, 0, fmt.Sprintf(
		"the configuration of feed %s changed after %d chunk(s) of this file were applied; the rest is not applied under another mapping. Release or replay the file to apply it whole under the new one",
		in.Feed, in.ChunksDone))
}

// chunkStatementTimeout bounds each statement of a chunk transaction.
const chunkStatementTimeout = "SET LOCAL statement_timeout = '30min'"

// rowPaths: how a chunk's rows reach the target.
const (
	pathNone   = iota // no valid rows
	pathDirect        // COPY straight into the target (all new, so far)
	pathMerge         // staging table and guarded merge
)

func (r *applyStage) rowPath(ch *chunk) int {
	switch {
	case ch.rows() == 0:
		return pathNone
	case r.direct && !ch.DupKeys:
		return pathDirect
	}
	return pathMerge
}
