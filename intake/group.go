package intake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A group is a run of one partner's small files that go through the
// pipeline together, each step the per-file step over several files: one
// claim (claim.go) renames them all at once under the partner's claim
// lock; each file is opened and read as the fetch stage reads a small file
// (openClaimed), all at once (pkg/sftp pipelines the requests on the one
// session); their bytes are spooled together and recorded spooled in one
// statement (spooled); the files' rows, ledger rows and states commit in
// one transaction (commitRows), and the files are archived together. A
// small file costs the per-file path about nine database round trips,
// five commits and eleven SFTP requests one after another; in a group
// those are shared (docs/performance.md).
//
// Every file keeps its own row, states, fencing token and receipt. A file
// that does anything the group does not cover — fails to read, has a
// rejected or repeated row, more rows than one chunk, a batch another
// intake holds — leaves the group in the state it has reached and goes on
// through the per-file path, which resumes from any state. Nothing is
// lost by leaving: a group that fails as a whole hands every file to the
// per-file path the same way.
//
// The group's transaction moves its files from spooled to applied in one
// commit with their rows, so a crash or a lost COMMIT leaves each file
// either spooled (nothing of it applied) or applied (all of it applied,
// ledger row included): the row itself says which, and the next poll
// resumes it from there (resumeOwn). There is no outcome to guess, so a
// group never marks outcome_unknown; the lost COMMIT still counts as an
// attempt of each file (countUnknown), as it does on the per-file path.
//
// This file holds the group and its run; the group's side of each step is
// a file of its own: group_fetch.go (read, spool, rows), group_commit.go
// (the transaction) and group_archive.go.

// fileGroup is one group's files on their way through the pipeline.
type fileGroup struct {
	d     *Daemon
	p     *partnerRT
	sess  *sftpconn.Session
	feed  *partners.Feed
	log   *slog.Logger
	files []*groupFile
	// alone are the files that left the group, for the per-file path.
	alone []*fileRun
	// closing: the CLOSEs of the handles fetch read, in flight (read)
	closing sync.WaitGroup
	// committedAt: taken before the transaction that moved the group's
	// files to applied, which checked every file's fencing token and
	// renewed its lease (ledger.AppliedGroup): the group's fence
	// (archive) while it is younger than a third of a lease.
	committedAt time.Time
}

// groupFile is one file of a group.
type groupFile struct {
	r    *fileRun
	data []byte
	ch   *chunk
	c    chunkCounts
}

// Why a file leaves its group (intake_group_files_total{result}).
const (
	LeftRead         = "read_failed"     // open or read failed, or the size is not the listed one
	LeftNotCSV       = "not_feed_csv"    // the header or a line does not read as the feed's CSV
	LeftRows         = "over_one_chunk"  // more rows than one chunk (groupable's size bound rules it out; checked anyway)
	LeftNoRows       = "no_rows"         // a header and no row
	LeftRejected     = "rejected_row"    // a row is rejected (the plan records it)
	LeftBadValue     = "value_refused"   // a value the target's column type refuses (fetch)
	LeftRefused      = "target_refused"  // a value the target refused at the group's write: a CHECK, a foreign key, a length (commit)
	LeftAfterRefused = "after_refused"   // a later file of a group whose file the target refused (or that repeats a key as the target compares keys): on alone after it, in id order
	LeftRepeatedKey  = "repeated_key"    // a key repeats within the file (the dedupe decides)
	LeftBatchBound   = "batch_bound"     // another intake holds the batch: duplicate or conflict
	LeftConflicts    = "newer_writes"    // rows a newer intake holds: the rejects report is written alone
	LeftArchive      = "archive_failed"  // the move to archive/ or the receipt failed
	LeftGroupFailed  = "group_tx_failed" // the group's transaction failed and was rolled back
	resultGrouped    = "grouped"
)

func (g *fileGroup) leave(f *groupFile, reason string, err error) {
	args := []any{"state", f.r.in.State, "reason", reason}
	if err != nil {
		args = append(args, "err", err)
	}
	f.r.log.Info("file leaves its group for the per-file path", args...)
	g.d.metrics.Grouped.WithLabelValues(g.p.cfg.ID, reason).Inc()
	g.alone = append(g.alone, f.r)
}

// runGroup takes claimed files through the group's steps, then runs the
// files that left the group on the per-file path.
func (d *Daemon) runGroup(ctx context.Context, p *partnerRT, sess *sftpconn.Session, ins []*ledger.Intake) error {
	g := &fileGroup{d: d, p: p, sess: sess}
	for _, in := range ins {
		r, err := d.newRun(p, sess, in)
		if err != nil {
			return err
		}
		r.placed = true // claimed by this poll
		g.files = append(g.files, &groupFile{r: r})
	}
	g.feed = g.files[0].r.feed
	d.metrics.Grouped.WithLabelValues(p.cfg.ID, resultGrouped).Add(float64(len(g.files)))
	g.log = d.log.With("partner", p.cfg.ID, "feed", g.feed.Name)
	// a file of the group no longer held is found by the group's next
	// statement, which leaves it out
	stopHB := keepLeases(ctx, d, g.log, ins, nil, func() { d.signals.GroupHeartbeat.Signal(p.cfg.ID) })
	all := g.files
	err := g.run(ctx)
	g.closing.Wait() // a handle's CLOSE outlives no group: its reply is on the way
	g.discardReceipts(all)
	stopHB()
	if err != nil {
		return err
	}
	// in intake id order, as they would have run without the group
	slices.SortFunc(g.alone, func(a, b *fileRun) int { return cmp.Compare(a.in.ID, b.in.ID) })
	for _, r := range g.alone {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := r.runAlone(ctx); err != nil {
			return err
		}
	}
	return nil
}

// run is the group's steps. An error of the group's own (a fault, a
// commit without answer) returns with the files where their rows say
// they are: the next poll resumes them one by one.
func (g *fileGroup) run(ctx context.Context) error {
	start := time.Now()
	tgt, err := g.d.targets.Get(ctx, g.feed)
	if err != nil {
		return err
	}
	if err := g.fetch(ctx, tgt); err != nil {
		return err
	}
	g.observe(ledger.StateClaimed, start)
	if len(g.files) == 0 {
		return nil
	}
	start = time.Now()
	err = g.commit(ctx, tgt)
	var rf *refusedFileError
	for tries := 0; tries < maxRefusedRetries && errors.As(err, &rf); tries++ {
		// A file's value the target refuses: that file goes on alone
		// (still spooled: the transaction was rolled back), where its
		// refused rows are rejected, and so does every file of the group
		// after it, so that the files still write in intake id order
		// (of two writing one key, insert_only keeps the first); the
		// files before it commit again. The merge goes in id order, so
		// the file found is the first that refuses, and a second
		// refusal is not expected: past the bound the group fails.
		g.sendOnFrom(rf.file, rf)
		if len(g.files) == 0 {
			return nil
		}
		err = g.commit(ctx, tgt)
	}
	var cu *CommitUnknownError
	if errors.As(err, &cu) {
		// Each file is spooled or applied, all of it or none; the rows
		// say which, and the next poll reads them (no guess is made).
		g.log.Warn("group commit outcome unknown; its files resume from their rows on the next poll", "intake_ids", g.ids(), "err", cu.Err)
		return g.countUnknown(ctx, cu)
	}
	if err != nil {
		// rolled back: every file is still spooled
		return g.failed(ctx, "group transaction failed", err)
	}
	g.observe(ledger.StateApplying, start) // the transaction plans and applies
	runs := make([]*fileRun, len(g.files))
	for i, f := range g.files {
		runs[i] = f.r
	}
	if err := endApply(ctx, g.d, runs...); err != nil {
		return err
	}
	start = time.Now()
	if err := g.archive(ctx); err != nil {
		return err
	}
	g.observe(ledger.StateApplied, start)
	return nil
}

// failed ends a step that failed for the group as a whole (what, err)
// with nothing of it recorded: every file goes on alone from the state it
// has (and the one at fault, if one is, fails there on its own). It
// returns ctx's error when that is why.
func (g *fileGroup) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	g.log.Warn(what+"; its files go on one by one", "intake_ids", g.ids(), "err", err)
	for _, f := range g.files {
		g.leave(f, LeftGroupFailed, nil)
	}
	g.files = nil
	return nil
}

// countUnknown counts the group's COMMIT without an answer as an attempt
// of each of its files, as a file's own commit without an answer counts
// (markUnknown), so that a COMMIT lost every time spends the files'
// retry budget whichever path they take: a file still spooled past its
// budget is failed for good by the run that takes it up (step).
func (g *fileGroup) countUnknown(ctx context.Context, cu *CommitUnknownError) error {
	ins := make([]*ledger.Intake, len(g.files))
	for i, f := range g.files {
		ins[i] = f.r.in
	}
	retry := g.d.cfg.Retry
	spent, err := g.d.ledger.GroupUnknown(ctx, ins, pgerr.Redact(cu), retry.Base, retry.Max, retry.Attempts, retry.Within)
	if err != nil {
		return fmt.Errorf("%w (and counting the attempt failed: %v)", cu, err)
	}
	if len(spent) > 0 {
		g.log.Error("files past their retry budget with a group commit outcome unknown; nothing of them was applied, and their next run fails them for good",
			"intake_ids", spent)
	}
	return nil
}

// maxRefusedRetries bounds the commits a group tries again after a file's
// refused value (group.run).
const maxRefusedRetries = 2

// sendOnFrom sends refused (its value refused by the target, or a key it
// repeats as the target compares keys: err) and every later file of the
// group on alone, in intake id order; the earlier ones stay.
func (g *fileGroup) sendOnFrom(refused *groupFile, err *refusedFileError) {
	id := refused.r.in.ID
	var stay, leave []*groupFile
	for _, f := range g.files {
		if f == refused || f.r.in.ID > id {
			leave = append(leave, f)
		} else {
			stay = append(stay, f)
		}
	}
	slices.SortFunc(leave, func(a, b *groupFile) int { return cmp.Compare(a.r.in.ID, b.r.in.ID) })
	for _, f := range leave {
		if f == refused {
			g.leave(f, err.reason(), err)
		} else {
			g.leave(f, LeftAfterRefused, nil)
		}
	}
	g.files = stay
}

// discardReceipts removes the receipt temporary files that files which
// left the group (or a group that failed) opened beside their reads and
// did not publish (fileRun.dropSite).
func (g *fileGroup) discardReceipts(all []*groupFile) {
	var wg sync.WaitGroup
	for _, f := range all {
		if f.r.site != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.r.dropSite()
			}()
		}
	}
	wg.Wait()
}

// ids are the intake ids of the files still in the group, for logs.
func (g *fileGroup) ids() []int64 {
	ids := make([]int64, len(g.files))
	for i, f := range g.files {
		ids[i] = f.r.in.ID
	}
	return ids
}

func (g *fileGroup) observe(from ledger.State, start time.Time) {
	d := time.Since(start)
	for range g.files {
		g.d.metrics.Stage(g.p.cfg.ID, from, d)
	}
}
