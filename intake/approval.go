package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/chunkrows"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/intake/slots"
	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Plans and approval. A feed with an `approval` policy
// has every file planned against its target before apply: its valid rows
// are staged and judged by the merge's own expressions without writing
// the target (target.Table.Plan), giving the counts of creates, updates,
// unchanged, deletes (snapshot), conflicts and rejects, and a plan hash
// over the file's sha256, the feed's mapping (feed_sha256, frozen with the
// file) and those counts. The plan, the move to the next state and the
// rejected rows commit in one transaction.
//
// A plan that needs a human (policy always, or past a threshold) moves the
// file to awaiting_approval: no lease, no worker, no heartbeat; the file
// stays claimed in processing/ and the partner's other files go on. Ops
// approve a plan hash or reject the file (ledger.Approve, Reject); either
// sends it back to spooled under a new token and an expired lease, so its
// owner's next poll (or the partner's poller: resumeDecided; or a
// reconciler's takeover) runs it again:
//
//   - rejected: quarantined, reason plan_rejected (step, worker.go);
//   - approved: planned again, here, immediately before apply. Only a plan
//     whose hash is the approved one moves the file to applying, in the
//     same transaction as the fresh plan's reads of the target; any other
//     (the target or the mapping changed, so the counts or the hash differ)
//     sends the file back to awaiting_approval with the new plan (audited
//     replan, reason plan_changed, metric, event), and the old hash is
//     refused from then on.
//
// What the approved plan guarantees once apply has begun: the target
// matched the approved counts at the moment the file moved to applying;
// the chunks then apply under the merge's per-row guards (never over a
// newer intake's row or an outside edit, insert_only/update_only as
// declared), so a row changed by someone else after that moment is
// reported as a conflict, not overwritten; a snapshot deletes only rows
// that no newer intake wrote and that were not edited outside intake. A
// file is never planned again once a chunk of it is applied: a mapping
// change part way fails it (mapping_changed) as for every feed.

// planRejected and planApproved are the ops decisions a file's next run
// acts on (file_intake.plan_decision).
const (
	planApproved = "approved"
	planRejected = "rejected"
)

// PlanHash is the plan hash of a file: the sha256 of a versioned text of
// the file's content sha256, its feed mapping's sha256, the plan's counts
// with the file's rows, and what the plan does row by row (the counts'
// Content: its keys, actions and changed values, and the keys it deletes),
// so two plans of the same counts over other rows never share a hash.
func PlanHash(contentSHA, feedSHA string, total int64, c target.PlanCounts) string {
	counts, _ := json.Marshal(c) // plain struct: fields in declaration order
	h := sha256.New()
	fmt.Fprintf(h, "intake-plan-v2\nfile %s\nmapping %s\nrows %d\ncounts %s\nchanges %s\n", contentSHA, feedSHA, total, counts, c.Content)
	return hex.EncodeToString(h.Sum(nil))
}

// planApproval computes the file's plan against the target and moves the
// file on (applying or awaiting_approval) with its plan, totals and
// rejected rows, in one transaction.
func (r *planStage) planApproval(ctx context.Context, sc *scan, res *planResult) error {
	in := r.in
	feedSHA := r.feed.Hash()
	var next ledger.State
	var rec ledger.PlanRecord
	// approved: ops approved a plan of this file, now (the decision's
	// run) or before (a re-plan after a mapping change found at a resume,
	// ledger.Replan): only that plan may be applied
	approved := in.PlanDecision == planApproved || in.ApprovedPlanHash != ""
	tgt, err := r.targetTable(ctx) // before the transaction: a first load queries the pool
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, r.d.db, func(tx pgx.Tx) error {
		counts, err := r.targetPlan(ctx, tx, tgt, res.Total)
		if err != nil {
			return err
		}
		rec = ledger.PlanRecord{Hash: PlanHash(in.SHA256, feedSHA, res.Total, counts)}
		if rec.Counts, err = json.Marshal(counts); err != nil {
			return err
		}
		next = ledger.StateApplying
		switch {
		case approved && in.ApprovedPlanHash == rec.Hash:
			// the approved plan still holds: apply it
		case approved:
			rec.Wait, rec.Replanned, rec.ApprovedWas = true, true, in.ApprovedPlanHash
		default:
			held := counts.Updates + counts.Unchanged + counts.Deletes + counts.NewerWrite + counts.OutsideEdit
			rec.Wait, rec.Why = r.feed.PlanWaits(res.Total, counts.Updates, counts.Deletes, held)
		}
		if rec.Wait {
			next = ledger.StateAwaitingApproval
		}
		if err := ledger.Plan(ctx, tx, in, next, res.Total, res.Rejected, feedSHA); err != nil {
			return err
		}
		if err := ledger.RecordPlan(ctx, tx, in, rec); err != nil {
			return err
		}
		if rec.Wait {
			if err := r.recordChanges(ctx, tx, tgt, counts); err != nil {
				return err
			}
		}
		return r.recordIssues(ctx, tx, sc)
	})
	if err != nil {
		return err
	}
	r.planned(sc, res, next)
	switch {
	case rec.Replanned:
		r.d.metrics.Plans.WithLabelValues(in.Partner, "replanned").Inc()
		r.log.Warn("approved plan no longer holds: the file awaits approval again", "plan_hash", rec.Hash,
			"approved_hash", rec.ApprovedWas, "reason", reason.PlanChanged)
	case rec.Wait:
		r.d.metrics.Plans.WithLabelValues(in.Partner, "awaiting_approval").Inc()
		r.log.Info("plan awaits approval", "plan_hash", rec.Hash, "why", rec.Why)
	case approved:
		r.d.metrics.Plans.WithLabelValues(in.Partner, "approved_applied").Inc()
		r.log.Info("approved plan holds: applying", "plan_hash", rec.Hash)
	default:
		r.d.metrics.Plans.WithLabelValues(in.Partner, "applied_at_once").Inc()
	}
	return nil
}

// targetPlan stages every valid row of the spooled file in tx and judges
// them against the target tgt (target.Table.Plan). Rows the row check or
// a column's encoding refuses count as invalid rejects. The caller
// resolved tgt (fileRun.targetTable) before it took tx's connection: a
// table not yet loaded is read on a connection of the pool.
func (r *planStage) targetPlan(ctx context.Context, tx pgx.Tx, tgt *target.Table, total int64) (target.PlanCounts, error) {
	var counts target.PlanCounts
	f, rd, err := r.spooledRows("plan")
	if err != nil {
		return counts, err
	}
	defer f.Close()
	// a plan reads every row of the file: its statements get the chunks'
	// bound, not the pool's lease-long one
	if _, err := tx.Exec(ctx, chunkStatementTimeout); err != nil {
		return counts, fmt.Errorf("plan: %w", err)
	}
	if err := tgt.Stage(ctx, tx); err != nil {
		return counts, fmt.Errorf("plan: stage: %w", err)
	}
	rowsPer := max(1, min(r.feed.ChunkRows, 50_000))
	c := newChunk(maphash.MakeSeed(), rowsPer, tgt)
	keyIdx := keyIndexes(r.feed)
	var invalid int64
	flush := func() error {
		if c.rows() == 0 {
			return nil
		}
		if err := tgt.CopyStage(ctx, tx, c.StagePayload()); err != nil {
			return fmt.Errorf("plan: copy: %w", err)
		}
		c.reset(0)
		return nil
	}
	for {
		row, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return counts, fmt.Errorf("plan: spooled file no longer reads as scanned: %w", err)
		}
		if row.Issue != nil {
			invalid++
			continue
		}
		if err := c.Add(row.Line, row.Values, row.Null, keyIdx); err != nil {
			var ve *chunkrows.ValueError
			if !errors.As(err, &ve) {
				return counts, err
			}
			invalid++
			continue
		}
		if c.rows() >= rowsPer || int64(len(c.Cols)) >= r.feed.ChunkBytes {
			if err := flush(); err != nil {
				return counts, err
			}
		}
	}
	if err := flush(); err != nil {
		return counts, err
	}
	counts, err = tgt.Plan(ctx, tx, r.writer(), r.in.Partner, r.in.Feed, invalid == 0 && total > 0)
	counts.Invalid = invalid
	return counts, err
}

// recordChanges records every change of the plan just judged in tx (its
// counts) for ops to review, after ledger.RecordPlan removed an earlier
// plan's: one statement in the target's package, from the plan's own
// rows (target.Table.RecordChanges).
func (r *fileRun) recordChanges(ctx context.Context, tx pgx.Tx, tgt *target.Table, counts target.PlanCounts) error {
	return tgt.RecordChanges(ctx, tx, r.in.ID, r.writer(), r.in.Partner, r.in.Feed, counts.Deletes > 0)
}

// recheckPlan: the file applies an approved plan and none of its chunks is
// applied yet, so its first chunk plans it again in its own transaction
// (recheck) before it writes anything. The state is read from the row
// (approved_plan_hash = plan_hash), so a restart between the plan and the
// first chunk checks it all the same.
func (r *applyStage) recheckPlan(ch *chunk) bool {
	in := r.in
	return ch.no == 0 && in.ChunksDone == 0 && in.ApprovedPlanHash != "" && in.PlanHash == in.ApprovedPlanHash
}

// planChangedError: the first chunk's fresh plan is not the approved one;
// the chunk's transaction rolled back and the file waits again (rewait).
type planChangedError struct{ rec ledger.PlanRecord }

func (e *planChangedError) Error() string {
	return fmt.Sprintf("the approved plan %s no longer holds (now %s)", e.rec.ApprovedWas, e.rec.Hash)
}

// recheck plans the file again in the first chunk's transaction tx,
// before its rows are written: the same plan as the approved one lets the
// chunk go on (the staging table emptied for it), in the same transaction,
// so the approved counts held against the target as this transaction saw
// it; another plan is a planChangedError.
func (r *applyStage) recheck(ctx context.Context, tx pgx.Tx, tgt *target.Table) error {
	in := r.in
	counts, err := r.planStage().targetPlan(ctx, tx, tgt, in.RowsTotal)
	if err != nil {
		return err
	}
	hash := PlanHash(in.SHA256, in.FeedSHA256, in.RowsTotal, counts)
	if hash == in.ApprovedPlanHash {
		if err := tgt.ClearStage(ctx, tx); err != nil {
			return fmt.Errorf("plan: clear stage: %w", err)
		}
		_, err := tx.Exec(ctx, `DROP TABLE intake_plan_rows`)
		return err
	}
	rec := ledger.PlanRecord{Hash: hash, Wait: true, Replanned: true, ApprovedWas: in.ApprovedPlanHash}
	if rec.Counts, err = json.Marshal(counts); err != nil {
		return err
	}
	return &planChangedError{rec: rec}
}

// rewait sends a file whose first chunk found the approved plan changed
// back to awaiting_approval with the new plan (fenced, only while no chunk
// is applied), audited, with its event.
//
// The first chunk's transaction, and the plan's rows with it, rolled
// back: the file is planned again in this transaction, so the plan that
// waits is stored with its changes (the one the first chunk found, or a
// newer one).
func (r *applyStage) rewait(ctx context.Context, pc *planChangedError) error {
	in := r.in
	tgt, err := r.targetTable(ctx) // before the transaction: a first load queries the pool
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, r.d.db, func(tx pgx.Tx) error {
		counts, err := r.planStage().targetPlan(ctx, tx, tgt, in.RowsTotal)
		if err != nil {
			return err
		}
		pc.rec.Hash = PlanHash(in.SHA256, in.FeedSHA256, in.RowsTotal, counts)
		if pc.rec.Counts, err = json.Marshal(counts); err != nil {
			return err
		}
		if err := ledger.Rewait(ctx, tx, in); err != nil {
			return err
		}
		if err := ledger.RecordPlan(ctx, tx, in, pc.rec); err != nil {
			return err
		}
		return r.recordChanges(ctx, tx, tgt, counts)
	})
	if err != nil {
		return err
	}
	in.State = ledger.StateAwaitingApproval
	r.d.metrics.Plans.WithLabelValues(in.Partner, "replanned").Inc()
	r.log.Warn("approved plan no longer holds at the first chunk: the file awaits approval again", "plan_hash", pc.rec.Hash,
		"approved_hash", pc.rec.ApprovedWas, "reason", reason.PlanChanged)
	return nil
}

// resumeDecided: the partner's poller takes over the files ops decided
// whose owner has not resumed them (it is gone, or no longer polls the
// partner), moves each into its own processing/ dir and runs it in a slot
// of pool. Takeover is the conditional statement of the reconciler
// (token, expired lease): of the owner and pollers racing, one takes each
// file.
func (d *housekeeping) resumeDecided(ctx context.Context, p *partnerRT, sess *sftpconn.Session, pool *slots.Pool) error {
	rows, err := d.ledger.Decided(ctx, p.cfg.ID, d.cfg.WorkerID)
	if err != nil {
		return err
	}
	for _, old := range rows {
		dst := sess.Layout.Processing(d.cfg.WorkerID, old.RemoteName)
		if p.cfg.Records() {
			dst = old.ClaimedPath // claim: record: the file stays where it is
		}
		if pool.Failed() {
			return nil // the poll ends with the pool's error
		}
		slot := d.startSlot(pool)
		if slot == nil {
			return nil
		}
		if err := d.workerID.StillHeld(ctx); err != nil {
			slot(nil) // no file waiting for a slot is taken after the hold ended
			return err
		}
		// the takeover and its move are one step in the partner's claim
		// section (ledger.InClaimSection)
		var in *ledger.Intake
		err := d.ledger.InClaimSection(ctx, p.cfg.ID, func(c *ledger.ClaimLock) error {
			var err error
			in, err = d.takeOverDecided(ctx, c, p, sess, old, dst)
			return err
		})
		if err != nil {
			slot(nil)
		}
		var fe *ledger.FencedError
		if errors.As(err, &fe) {
			continue // resumed or taken meanwhile
		}
		if ledger.PathHeld(err) {
			// a live intake of this worker holds the name in its
			// processing dir (the name sent again): this one is taken
			// once that one is done, and the partner's other files go on
			d.log.Warn("a file ops decided waits: another live intake of its name holds its place in this worker's processing dir",
				"partner", p.cfg.ID, "intake_id", old.ID, "path", dst)
			continue
		}
		if err != nil {
			return err
		}
		d.log.Info("took over a file ops decided", "partner", p.cfg.ID, "intake_id", in.ID, "from_worker", old.Worker, "decision", old.PlanDecision)
		d.runResumed(ctx, p, sess, in, slot)
	}
	return nil
}

// takeOverDecided takes a decided file over and moves it into this
// worker's processing dir, in the partner's claim section c (both commit
// with it).
func (d *housekeeping) takeOverDecided(ctx context.Context, c *ledger.ClaimLock, p *partnerRT, sess *sftpconn.Session, old *ledger.Intake, dst string) (*ledger.Intake, error) {
	in, err := c.TakeOver(ctx, d.ledger, old, d.cfg.WorkerID, dst)
	if err != nil {
		return nil, err
	}
	if p.cfg.Records() || old.ClaimedPath == dst {
		return in, nil
	}
	if err := c.StillHeld(ctx); err != nil {
		return nil, err
	}
	var left *sitefile.ManifestLeft
	err = c.Busy(ctx, d.ledger, func() error {
		copied := sess.AllowCopy(max(old.Size, old.ListedSize)) // a RENAME that copies answers late
		defer copied()
		var err error
		left, err = sitefile.MoveClaimed(sess, old.ClaimedPath, dst, in.ManifestName)
		return err
	})
	if left != nil {
		// the reconciler's next run reports it, and moves it beside the
		// file while its row is live
		d.log.Warn("a decided file was moved without its manifest", "partner", p.cfg.ID, "intake_id", in.ID, "err", left)
	}
	switch {
	case errors.Is(err, sitefile.ErrNotMoved):
		// still at its old path: the row is pointed back at it (under
		// the new token), and the file runs where it is, its manifest
		// beside it
		d.log.Warn("a decided file could not be moved; it runs where its owner left it", "partner", p.cfg.ID, "intake_id", in.ID, "err", err)
		// in the section: should it fail, the takeover is rolled back
		// with it, and the row names the file where it is
		return in, c.RestorePath(ctx, in, old.ClaimedPath)
	case err != nil:
		// the run goes on from the spool where it can (ensureSpooled)
		d.log.Warn("a decided file is not where its owner left it", "partner", p.cfg.ID, "intake_id", in.ID, "path", old.ClaimedPath, "err", err)
	}
	return in, nil
}
