package intake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/rows"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
)

// A group is a run of one partner's small files that go through the
// pipeline together: each step's SFTP requests go out at once (pkg/sftp
// pipelines them on the one session; the claim RENAMEs one at a time
// while another replica claims from the partner, see claimGroup); each
// state change is one set-based statement, and the files' rows, ledger rows and states commit
// in one transaction. A small file costs the per-file path about nine
// database round trips, five commits and eleven SFTP requests one after
// another; in a group those are shared (docs/performance.md).
//
// Every file keeps its own row, states, fencing token and receipt. A file
// that does anything the group does not cover — fails to read, has a
// rejected or repeated row, more rows than one chunk, a batch another
// intake holds — leaves the group in the state it has reached and goes on
// through the per-file path, which resumes from any state. Nothing is
// lost by leaving: a group that fails as a whole hands every file to the
// per-file path the same way.
//
// The group's transaction moves its files from claimed to applied in one
// commit with their rows, so a crash or a lost COMMIT leaves each file
// either claimed (nothing of it applied) or applied (all of it applied,
// ledger row included): the row itself says which, and the next poll
// resumes it from there (resumeOwn). There is no outcome to guess, so a
// group never marks outcome_unknown.

// groupable reports whether a candidate can go through a group: a small
// plain file, with no manifest, whose name gives a batch id, and too small
// to hold more rows than one chunk (a row takes at least one byte per
// column: its delimiters and its line end).
func groupable(p *partners.Config, c candidate) bool {
	return c.manifest == "" && c.size > 0 && c.size < smallFileBytes && c.size <= p.Limits.MaxFileBytes &&
		c.size <= int64(c.feed.ChunkRows)*int64(max(len(c.feed.Columns), 1)) &&
		compressionOf(c.name) == "" && partners.ValidBatchID(c.feed.BatchIDFromName(c.name))
}

// maxGroupBytes bounds a group's listed bytes: a group holds its files in
// memory while it runs (GroupFiles × 64 KiB at most otherwise).
const maxGroupBytes = 1 << 20

// groupAt returns the group that starts at cands[0]: up to n groupable
// files of one feed with distinct batch ids and maxGroupBytes in all, in
// listing order (oldest first). Fewer than two is no group.
func groupAt(p *partners.Config, cands []candidate, n int) []candidate {
	n = min(n, p.GroupFiles)
	if n < 2 || !groupable(p, cands[0]) {
		return nil
	}
	seen := map[string]bool{}
	var g []candidate
	var bytes int64
	for _, c := range cands {
		if len(g) == n || c.feed != cands[0].feed || !groupable(p, c) || bytes+c.size > maxGroupBytes {
			break
		}
		bytes += c.size
		b := c.feed.BatchIDFromName(c.name)
		if seen[b] {
			break
		}
		seen[b] = true
		g = append(g, c)
	}
	if len(g) < 2 {
		return nil
	}
	return g
}

// claimGroup claims a group's files as claim does one file: by RENAME, in
// listing order, each under the id allocated for it before the renames
// (both under the partner's claim lock, see claimLock); then one statement
// records every file renamed.
//
// Intake ids must follow file age even when two replicas claim from one
// partner at the same moment (around a change of replicas, or with
// affinity "none"). Renames sent all at once would let a replica win a
// newer file under an id allocated before the other replica's ids for
// older files (TestRacingGroupsKeepIdsInFileAge caught it), so a group's
// ids and renames are one section under the partner's claim lock
// (claimLock): every other claim of the partner is wholly before or after
// it. A rename is then lost only to a claim made before the section (this
// poll's listing is older than it), and the renames go all at once only
// while no race shows: when one of them is lost, the files this group won
// are put back into ready/ (nothing recorded them yet; inside the
// section, so no other replica sees them gone) and the caller walks the
// rest of the poll one rename at a time (sequential), stopping at the
// first file not claimed and going on from the next with fresh ids, as
// single claims do.
//
// It returns the claimed rows, how many candidates it went through (0
// after putting the group back: the caller walks them again one at a
// time), whether a race showed, and an error for a rename that failed
// otherwise than by losing a race.
func (d *Daemon) claimGroup(ctx context.Context, p *partnerRT, sess *partners.Session, g []candidate, sequential bool) ([]*Intake, int, bool, error) {
	lock, err := d.store.lockClaims(ctx, p.cfg.ID)
	if err != nil {
		return nil, 0, false, err
	}
	defer lock.release()
	ids, err := lock.intakeIDs(ctx, len(g))
	if err != nil {
		return nil, 0, false, err
	}
	errs := make([]error, len(g))
	walked := len(g)
	if sequential {
		for i, c := range g {
			errs[i] = sess.Rename(sess.Layout.Ready(c.name), sess.Layout.Processing(d.cfg.WorkerID, c.name))
			if errs[i] != nil {
				walked = i + 1
				break
			}
		}
	} else {
		var wg sync.WaitGroup
		for i, c := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = sess.Rename(sess.Layout.Ready(c.name), sess.Layout.Processing(d.cfg.WorkerID, c.name))
			}()
		}
		wg.Wait()
	}
	raced := false
	for _, err := range errs[:walked] {
		if err != nil && partners.IsNotExist(err) {
			raced = true
			d.metrics.claimsLost.WithLabelValues(p.cfg.ID).Inc()
		}
	}
	if raced {
		d.peers.lost()
	}
	if raced && !sequential {
		kept := d.putBack(p, sess, g, errs)
		if len(kept) == 0 {
			return nil, 0, true, nil
		}
		// a file that could not be put back is recorded as claimed
		errs = kept
	}
	var renamed []*Intake
	var failed error
	for i, c := range g[:walked] {
		dst := sess.Layout.Processing(d.cfg.WorkerID, c.name)
		switch err := errs[i]; {
		case err == nil:
			renamed = append(renamed, &Intake{ID: ids[i], Partner: p.cfg.ID, Feed: c.feed.Name, RemoteName: c.name,
				ClaimedPath: dst, ListedSize: c.size, Worker: d.cfg.WorkerID})
		case partners.IsNotExist(err), errors.Is(err, errPutBack):
		default:
			if _, serr := sess.Lstat(dst); serr == nil {
				d.metrics.skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
			} else if failed == nil {
				failed = fmt.Errorf("claim %s: %w", c.name, err)
			}
		}
	}
	if raced && !sequential {
		walked = 0
	}
	lock.release() // every rename of the section is done; recording needs no lock
	if err := fault.Check("claim:after_rename"); err != nil {
		// as if the replies were lost: the files sit in our processing
		// dir without rows, and the next poll adopts them
		return nil, walked, raced, fmt.Errorf("claim: %w", err)
	}
	if len(renamed) == 0 {
		return nil, walked, raced, failed
	}
	claimed, err := d.store.insertClaims(ctx, renamed)
	if err != nil {
		return nil, walked, raced, err
	}
	return claimed, walked, raced, failed
}

// errPutBack marks a file a racing group put back into ready/.
var errPutBack = errors.New("put back into ready/")

// putBack renames the files a racing group won back into ready/, all at
// once. It returns the group's rename results with every file put back
// marked errPutBack; a file that could not be put back (its name is in
// ready/ again) keeps its nil result and is recorded as claimed. Nothing
// but the rename has happened to these files, so putting them back leaves
// no trace but a log line.
func (d *Daemon) putBack(p *partnerRT, sess *partners.Session, g []candidate, errs []error) []error {
	out := append([]error(nil), errs...)
	back := make([]error, len(g))
	var wg sync.WaitGroup
	for i, c := range g {
		if errs[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			back[i] = sess.Rename(sess.Layout.Processing(d.cfg.WorkerID, c.name), sess.Layout.Ready(c.name))
		}()
	}
	wg.Wait()
	n, kept := 0, 0
	for i := range g {
		if errs[i] != nil {
			continue
		}
		if back[i] == nil {
			out[i] = errPutBack
			n++
		} else {
			kept++
		}
	}
	d.log.Info("another replica claims from the partner at the same moment: the group's files were put back and are claimed one at a time",
		"partner", p.cfg.ID, "put_back", n, "kept", kept)
	if kept == 0 {
		return nil
	}
	return out
}

// fileGroup is one group's files on their way through the pipeline.
type fileGroup struct {
	d     *Daemon
	p     *partnerRT
	sess  *partners.Session
	feed  *partners.Feed
	log   *slog.Logger
	files []*groupFile
	// alone are the files that left the group, for the per-file path.
	alone []*fileRun
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
	LeftRead        = "read_failed"     // open or read failed, or the size is not the listed one
	LeftNotCSV      = "not_feed_csv"    // the header or a line does not read as the feed's CSV
	LeftRows        = "over_one_chunk"  // more rows than one chunk (groupable's size bound rules it out; checked anyway)
	LeftNoRows      = "no_rows"         // a header and no row
	LeftRejected    = "rejected_row"    // a row is rejected (the plan records it)
	LeftBadValue    = "value_refused"   // a value the target's column type refuses
	LeftRepeatedKey = "repeated_key"    // a key repeats within the file (the dedupe decides)
	LeftBatchBound  = "batch_bound"     // another intake holds the batch: duplicate or conflict
	LeftConflicts   = "newer_writes"    // rows a newer intake holds: the rejects report is written alone
	LeftArchive     = "archive_failed"  // the move to archive/ or the receipt failed
	LeftGroupFailed = "group_tx_failed" // the group's transaction failed and was rolled back
	resultGrouped   = "grouped"
)

func (g *fileGroup) leave(f *groupFile, reason string, err error) {
	args := []any{"state", f.r.in.State, "reason", reason}
	if err != nil {
		args = append(args, "err", err)
	}
	f.r.log.Info("file leaves its group for the per-file path", args...)
	g.d.metrics.grouped.WithLabelValues(g.p.cfg.ID, reason).Inc()
	g.alone = append(g.alone, f.r)
}

// runGroup takes claimed files through the group's steps, then runs the
// files that left the group on the per-file path.
func (d *Daemon) runGroup(ctx context.Context, p *partnerRT, sess *partners.Session, ins []*Intake) error {
	g := &fileGroup{d: d, p: p, sess: sess}
	for _, in := range ins {
		r, err := d.newRun(p, sess, in)
		if err != nil {
			return err
		}
		g.files = append(g.files, &groupFile{r: r})
	}
	g.feed = g.files[0].r.feed
	d.metrics.grouped.WithLabelValues(p.cfg.ID, resultGrouped).Add(float64(len(g.files)))
	g.log = d.log.With("partner", p.cfg.ID, "feed", g.feed.Name)
	hctx, stopHB := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		g.heartbeat(hctx, ins)
	}()
	err := g.run(ctx)
	stopHB()
	<-hbDone
	if err != nil {
		return err
	}
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
	tgt, err := g.d.target(ctx, g.feed)
	if err != nil {
		return err
	}
	if err := g.fetch(ctx, tgt); err != nil {
		return err
	}
	g.observe(StateClaimed, start)
	if len(g.files) == 0 {
		return nil
	}
	start = time.Now()
	err = g.commit(ctx, tgt)
	var cu *CommitUnknownError
	if errors.As(err, &cu) {
		// Each file is claimed or applied, all of it or none; the rows
		// say which, and the next poll reads them (no guess is made).
		g.log.Warn("group commit outcome unknown; its files resume from their rows on the next poll", "intake_ids", g.ids(), "err", cu.Err)
		return nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Rolled back: every file is still claimed; each goes on alone
		// (and the one at fault, if one is, fails there on its own).
		g.log.Warn("group transaction failed; its files go on one by one", "intake_ids", g.ids(), "err", err)
		for _, f := range g.files {
			g.leave(f, LeftGroupFailed, nil)
		}
		g.files = nil
		return nil
	}
	g.observe(StateApplying, start) // the transaction plans and applies
	if err := fault.Check("apply:after_commit"); err != nil {
		return err
	}
	start = time.Now()
	if err := g.archive(ctx); err != nil {
		return err
	}
	g.observe(StateApplied, start)
	return nil
}

// ids are the intake ids of the files still in the group, for logs.
func (g *fileGroup) ids() []int64 {
	ids := make([]int64, len(g.files))
	for i, f := range g.files {
		ids[i] = f.r.in.ID
	}
	return ids
}

func (g *fileGroup) observe(from State, start time.Time) {
	d := time.Since(start)
	for range g.files {
		g.d.metrics.stage(g.p.cfg.ID, from, d)
	}
}

// heartbeat extends the group's leases until the group's steps are done.
// Only ids and tokens are read, which a group never changes.
func (g *fileGroup) heartbeat(ctx context.Context, ins []*Intake) {
	everyTick(ctx, g.d.store.lease/3, func() bool {
		if err := g.d.store.heartbeatGroup(ctx, ins); err != nil && ctx.Err() == nil {
			g.log.Warn("heartbeat failed", "err", err)
		}
		g.d.signals.GroupHeartbeat.Signal(g.p.cfg.ID)
		return true
	})
}

// fetch reads every file of the group at once (open, one read of its
// listed size plus one byte, close), spools them together, and reads
// their rows into chunks. The rows are in memory only as long as the
// group runs: a group holds at most GroupFiles × 64 KiB.
func (g *fileGroup) fetch(ctx context.Context, tgt *target) error {
	errs := make([]error, len(g.files))
	var wg sync.WaitGroup
	for i, f := range g.files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.data, errs[i] = g.read(f.r.in)
		}()
	}
	wg.Wait()
	if err := fault.Check("download:mid"); err != nil {
		return err
	}
	var kept []*groupFile
	var data [][]byte
	for i, f := range g.files {
		if errs[i] != nil {
			g.leave(f, LeftRead, errs[i])
			continue
		}
		kept, data = append(kept, f), append(data, f.data)
	}
	g.files = kept
	if len(kept) == 0 {
		return nil
	}
	es, err := g.d.spool.PutAll(g.p.cfg.ID, data)
	if err != nil {
		return err
	}
	for i, f := range kept {
		in := f.r.in
		in.SHA256, in.Size, in.DataSHA256, in.DataSize = es[i].SHA256, es[i].Size, es[i].SHA256, es[i].Size
		in.BatchID = g.feed.BatchIDFromName(in.RemoteName)
		g.d.metrics.bytesDownloaded.WithLabelValues(in.Partner).Add(float64(es[i].Size))
	}
	if err := fault.Check("spool:after"); err != nil {
		return err
	}
	kept = kept[:0]
	seed := maphash.MakeSeed()
	keyIdx := keyIndexes(g.feed)
	for _, f := range g.files {
		if reason := g.rows(f, tgt, seed, keyIdx); reason != "" {
			f.data = nil
			g.leave(f, reason, nil)
			continue
		}
		f.data = nil
		kept = append(kept, f)
	}
	g.files = kept
	return nil
}

// errSizeChanged: a group file's bytes are not its listed size.
var errSizeChanged = errors.New("the file's size is not the size it was listed with")

// read reads a claimed small file whole.
func (g *fileGroup) read(in *Intake) ([]byte, error) {
	f, err := g.sess.Open(in.ClaimedPath)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	buf := make([]byte, in.ListedSize+1)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read: %w", err)
	}
	if int64(n) != in.ListedSize {
		return nil, errSizeChanged
	}
	return buf[:n], nil
}

// rows reads a group file's rows into its one chunk, or returns the
// reason the file leaves the group.
func (g *fileGroup) rows(f *groupFile, tgt *target, seed maphash.Seed, keyIdx []int) string {
	rd, err := rows.NewReader(bytes.NewReader(f.data), g.feed, g.p.cfg.Limits.MaxRows)
	if err != nil {
		return LeftNotCSV
	}
	ch := newChunk(seed, 16, tgt.copyEncoders())
	var total int64
	for {
		row, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return LeftNotCSV
		}
		if total++; total > int64(g.feed.ChunkRows) {
			return LeftRows
		}
		if row.Issue != nil {
			return LeftRejected
		}
		ch.span(row.Line)
		if err := ch.add(row.Line, row.Values, row.Null, keyIdx); err != nil {
			return LeftBadValue
		}
	}
	switch {
	case total == 0:
		return LeftNoRows
	case ch.dupKeys:
		return LeftRepeatedKey
	}
	f.ch = ch
	return ""
}

// commit is the group's transaction: every file claimed -> spooled with
// its batch bound; the files that own their batch then have their rows
// written (one COPY for all of them while their keys are new, else each
// file's merge in id order), their ledger rows and their totals, and move
// to applied. A file whose batch another intake holds commits as spooled
// and leaves the group (duplicate or conflict, decided alone).
func (g *fileGroup) commit(ctx context.Context, tgt *target) error {
	tx, err := g.d.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("group begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ins := make([]*Intake, len(g.files))
	for i, f := range g.files {
		ins[i] = f.r.in
	}
	bound, err := g.d.store.spoolGroup(ctx, tx, ins)
	if err != nil {
		return err
	}
	var owners, fenced []*groupFile
	var spooledAlone []*groupFile
	for _, f := range g.files {
		b, ok := bound[f.r.in.ID]
		switch {
		case !ok:
			fenced = append(fenced, f)
		case b == nil || b.verdict != VerdictNew:
			f.r.bound = b
			spooledAlone = append(spooledAlone, f)
		default:
			owners = append(owners, f)
		}
	}
	if len(owners) > 0 {
		if err := g.writeRows(ctx, tx, tgt, owners); err != nil {
			return err
		}
		gs := make([]groupCounts, len(owners))
		for i, f := range owners {
			f.c.unchanged = int64(f.ch.rows()) - f.c.applied - f.c.conflict
			gs[i] = groupCounts{in: f.r.in, first: f.ch.first, last: f.ch.last, c: f.c}
		}
		n, err := g.d.store.appliedGroup(ctx, tx, gs)
		if err != nil {
			return err
		}
		if n != len(owners) {
			return fmt.Errorf("group: %d of %d files moved to applied under locks this transaction holds", n, len(owners))
		}
	}
	if err := fault.Check("apply:mid_chunk"); err != nil {
		return err
	}
	first := ins[0].ID
	if err := fault.Check("commit:lost"); err != nil {
		return &CommitUnknownError{IntakeID: first, Err: err}
	}
	if err := tx.Commit(ctx); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return fmt.Errorf("group commit: %w", err)
		}
		return &CommitUnknownError{IntakeID: first, Err: err}
	}
	if err := fault.Check("commit:reply_lost"); err != nil {
		return &CommitUnknownError{IntakeID: first, Err: err}
	}
	for _, f := range fenced {
		f.r.fencedOut("spooled (group)")
	}
	for _, f := range spooledAlone {
		f.r.in.State = StateSpooled
		g.leave(f, LeftBatchBound, nil)
	}
	for _, f := range owners {
		in := f.r.in
		in.State, in.ChunksDone = StateApplied, 1
		in.RowsTotal = int64(f.ch.rows())
		in.RowsApplied, in.RowsUnchanged, in.RowsConflict = f.c.applied, f.c.unchanged, f.c.conflict
		g.d.metrics.rows(in.Partner, f.c)
	}
	g.files = owners
	return nil
}

// writeRows writes the owners' rows: one COPY straight into the target
// under a savepoint, each row with its own file's intake id, while no key
// repeats across the files; when the target refuses that (a key exists),
// or keys repeat, each file's chunk goes through the staging table and
// the guarded merge, in intake id order, as the per-file path would.
func (g *fileGroup) writeRows(ctx context.Context, tx pgx.Tx, tgt *target, owners []*groupFile) error {
	seen := map[uint64]bool{}
	repeat := false
	for _, f := range owners {
		for k := range f.ch.keys {
			if seen[k] {
				repeat = true
			}
			seen[k] = true
		}
	}
	if !repeat {
		if _, err := tx.Exec(ctx, "SAVEPOINT intake_direct"); err != nil {
			return fmt.Errorf("group savepoint: %w", err)
		}
		var payload []byte
		if tgt.binary {
			payload = append(payload, copyBinaryHeader...)
		}
		for _, f := range owners {
			payload = f.ch.appendDirect(payload, g.p.cfg.ID, f.r.in.ID)
		}
		if tgt.binary {
			payload = append(payload, copyBinaryTrailer...)
		}
		_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(payload), tgt.directCopy)
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
	if _, err := tx.Exec(ctx, tgt.stageDDL); err != nil {
		return fmt.Errorf("group stage: %w", err)
	}
	for i, f := range owners {
		if i > 0 {
			if _, err := tx.Exec(ctx, "DELETE FROM "+tgt.stage); err != nil {
				return fmt.Errorf("group stage: %w", err)
			}
		}
		if err := f.r.writeRows(ctx, tx, tgt, f.ch, pathMerge, f.r.in.ID, &f.c); err != nil {
			return err
		}
	}
	return nil
}

// archive moves every applied file of the group to archive/ and publishes
// its receipt, all at once, then records them archived in one statement.
// A file with rows a newer intake holds (conflicts, which need a rejects
// report) or whose remote step fails leaves the group applied: the
// per-file path archives it, idempotently.
func (g *fileGroup) archive(ctx context.Context) error {
	var done []*groupFile
	for _, f := range g.files {
		if f.r.in.RowsConflict > 0 {
			g.leave(f, LeftConflicts, nil)
			continue
		}
		done = append(done, f)
	}
	errs := make([]error, len(done))
	var wg sync.WaitGroup
	for i, f := range done {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = f.r.archiveRemote(ctx, OutcomeAccepted, 0)
		}()
	}
	wg.Wait()
	var ins []*Intake
	var ok []*groupFile
	for i, f := range done {
		if errs[i] != nil {
			if errors.Is(errs[i], fault.ErrInjected) {
				return errs[i]
			}
			g.leave(f, LeftArchive, errs[i])
			continue
		}
		ins, ok = append(ins, f.r.in), append(ok, f)
	}
	if len(ins) == 0 {
		return nil
	}
	moved, err := g.d.store.archiveGroup(ctx, ins)
	if err != nil {
		return err
	}
	for _, f := range ok {
		if !moved[f.r.in.ID] {
			f.r.fencedOut("finish as archived (group)")
			continue
		}
		f.r.in.State = StateArchived
		f.r.archived(OutcomeAccepted, StateArchived)
	}
	return nil
}
