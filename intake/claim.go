package intake

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/siteread"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// The claim: a file of ready/ becomes this worker's by a RENAME into
// processing/<worker>/, and its row is recorded after it. One file, or a
// group of small files (group.go) that go through the pipeline together,
// is claimed by the same steps:
//
//  1. under the partner's claim lock (ledger.ClaimLock), an intake id is
//     allocated for each file, in file age order, and committed as the id
//     of the file's processing path (ledger.KeepClaimIDs) before its
//     rename;
//  2. each file is renamed: a lone data file with its OPEN sent behind
//     the RENAME (RenameAndOpen, one round trip for both; the download
//     takes the file), a group's renames all at once (pkg/sftp pipelines
//     them on the session), or one at a time while another replica
//     claims from the partner (sequential);
//  3. a manifest follows its data file into processing/;
//  4. the claims are recorded in the section's transaction, whose commit
//     ends it.
//
// A lost race (the file is gone from ready/) is no error: the processing
// directory exists, so "no such file" can only mean another worker won;
// it is counted, and the partner's pollers are looked up again. A crash
// between the rename and the row leaves a file in processing/<worker>/
// that resumeOwn adopts (failure matrix rows 1 and 2), under the id kept
// for its path, whichever process adopts it.
//
// Ids follow file age even when two replicas claim from one partner at
// the same moment: the ids and renames are one section under the lock,
// so every other claim of the partner is wholly before or after it. A
// rename is then lost only to a claim made before the section (this
// poll's listing is older than it), and a group's renames go all at once
// only while no race shows: when one of them is lost, the files the group
// won are put back into ready/ (nothing recorded them yet; inside the
// section, so no other replica sees them gone) and the claim loop walks
// the rest of the poll one rename at a time, stopping at the first file
// not claimed and going on from the next with fresh ids.

// claimed is what one claim took.
type claimed struct {
	ins []*ledger.Intake
	// opening: a lone data file opened behind its RENAME, for its download
	opening *sftpconn.Opening
	// walked: how many candidates the claim went through (0 after putting
	// a group back: the claim loop walks them again one at a time)
	walked int
	// raced: another replica claims from the partner
	raced bool
}

// claim claims cands (one file, or a group: groupAt), renaming one at a
// time when sequential. An error is returned for a rename that failed
// otherwise than by losing a race, or a step after it; what was claimed
// and recorded before the error is returned with it.
func (d *claimStage) claim(ctx context.Context, p *partnerRT, sess *sftpconn.Session, cands []candidate, sequential bool) (claimed, error) {
	// checked before the claim section's connection is taken: a one-shot
	// run's check uses the pool's idle one (workerid.go)
	if err := d.workerID.StillHeld(ctx); err != nil {
		return claimed{}, err
	}
	if p.cfg.Records() {
		in, err := d.claimRecord(ctx, p, sess, cands[0])
		return claimed{ins: nonNil(in), walked: 1}, err
	}
	if err := fault.Check("claim:before_rename"); err != nil {
		// between the listing and the claim (a test pauses here to change
		// ready/ under the listing)
		return claimed{}, fmt.Errorf("claim: %w", err)
	}
	lock, ids, err := d.ledger.LockClaims(ctx, p.cfg.ID, len(cands))
	if err != nil {
		return claimed{}, err
	}
	defer lock.Release()
	// Each id is kept for its file's processing path before the RENAME
	// (ledger.KeepClaimIDs): whoever adopts a file this claim renamed and
	// did not record (a crash before the section's commit) records it under
	// its id, its place among the partner's claims.
	dsts := make([]string, len(cands))
	for i, c := range cands {
		dsts[i] = sess.Layout.Processing(d.cfg.WorkerID, c.Name)
	}
	held, err := d.ledger.KeepClaimIDs(ctx, p.cfg.ID, dsts, ids)
	if err != nil {
		return claimed{}, err
	}
	// the kept ids of paths no file of this claim reached are dropped
	var missed keptIDs
	defer func() { d.dropClaimIDs(ctx, p, missed) }()
	// A path that held an id already has a file there (one waiting for
	// its adoption, whose id it is; or a live row's, about to leave), or
	// none: a claim that kept the id died before its RENAME. Under the
	// lock nothing moves a file into this worker's dir, so a look at the
	// path tells which: the claim's own id replaces a stale one before the
	// RENAME, and replaces the id of a path found taken once a RENAME to it
	// went through after all (the live row's file left meanwhile: the id
	// was a stale one). A look that fails otherwise fails the claim, as a
	// RENAME would.
	taken := map[string]bool{}
	for i, dst := range dsts {
		if !held[dst] {
			continue
		}
		_, err := sess.Lstat(dst)
		if err == nil {
			taken[dst] = true
			continue
		}
		if sftpconn.IsNotExist(err) {
			err = d.ledger.SetClaimID(ctx, p.cfg.ID, dst, ids[i])
		}
		if err != nil {
			for j := range dsts {
				missed.add(dsts[j], ids[j]) // nothing renamed yet
			}
			return claimed{}, fmt.Errorf("claim %s: %w", cands[i].Name, err)
		}
	}
	out := claimed{walked: len(cands)}
	errs := make([]error, len(cands))
	switch {
	case len(cands) == 1 && cands[0].Manifest == "":
		// a manifest pair's data file may never be read (manifestDuplicate)
		out.opening, errs[0] = d.rename(sess, cands[0], dsts[0], true)
	case len(cands) == 1 || sequential:
		for i, c := range cands {
			if _, errs[i] = d.rename(sess, c, dsts[i], false); errs[i] != nil {
				out.walked = i + 1
				break
			}
		}
	default:
		var wg sync.WaitGroup
		for i, c := range cands {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = d.rename(sess, c, dsts[i], false)
			}()
		}
		wg.Wait()
	}
	keep := false
	defer func() {
		if out.opening != nil && !keep {
			out.opening.Discard()
		}
	}()
	for _, err := range errs[:out.walked] {
		if err != nil && sftpconn.IsNotExist(err) {
			out.raced = true
			d.metrics.ClaimsLost.WithLabelValues(p.cfg.ID).Inc()
		}
	}
	if out.raced {
		d.peers.Lost() // another replica claims here: look again who polls the partner
	}
	putBack := out.raced && !sequential && len(cands) > 1
	if putBack {
		kept := d.putBack(p, sess, cands, errs)
		if len(kept) == 0 {
			for i := range cands {
				if errs[i] == nil || sftpconn.IsNotExist(errs[i]) {
					missed.add(dsts[i], ids[i]) // put back, or lost
				}
			}
			return claimed{raced: true}, nil
		}
		// a file that could not be put back is recorded as claimed
		errs = kept
	}
	var renamed []*ledger.Intake
	var manifests []string // renamed[i]'s manifest, to follow it
	var failed error
	for i, c := range cands[:out.walked] {
		dst := dsts[i]
		switch err := errs[i]; {
		case err == nil:
			renamed = append(renamed, &ledger.Intake{ID: ids[i], Partner: p.cfg.ID, Feed: c.Feed.Name, RemoteName: c.Name,
				ClaimedPath: dst, ListedSize: c.Size, ListedMTime: c.MTime, Worker: d.cfg.WorkerID})
			manifests = append(manifests, c.Manifest)
			if taken[dst] {
				if err := d.ledger.SetClaimID(ctx, p.cfg.ID, dst, ids[i]); err != nil {
					d.log.Warn("could not keep a claim's id for its path; should its row not be recorded either, its adoption takes an older claim's id", "partner", p.cfg.ID, "intake_id", ids[i], "err", err)
				}
			}
		case sftpconn.IsNotExist(err), errors.Is(err, errPutBack):
			missed.add(dst, ids[i])
		default:
			if _, serr := sess.Lstat(dst); serr == nil {
				// The same name is still in our processing dir from an
				// earlier claim, which is resumed; this one waits for a
				// later poll. Its id, if the path kept it, is dropped: the
				// file there is another's.
				d.metrics.Skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
				missed.add(dst, ids[i])
			} else if sftpconn.IsRefused(err) {
				d.claimRefused(p, c.Name, err)
				p.refused.Remember(c.Name, c.Size, c.MTime)
				missed.add(dst, ids[i])
			} else if failed == nil {
				// the RENAME's outcome is unknown: its id stays kept
				failed = fmt.Errorf("claim %s: %w", c.Name, err)
			}
		}
	}
	for i := out.walked; i < len(cands); i++ {
		missed.add(dsts[i], ids[i]) // never renamed
	}
	if putBack {
		out.walked = 0
	}
	if err := fault.Check("claim:after_rename"); err != nil {
		// as if the replies were lost: the files sit in our processing
		// dir without rows, and the next poll adopts them
		return claimed{walked: out.walked, raced: out.raced}, fmt.Errorf("claim: %w", err)
	}
	if len(renamed) == 0 {
		return claimed{walked: out.walked, raced: out.raced}, failed
	}
	pairs := renamed[:0:0]
	for i, in := range renamed {
		if m := manifests[i]; m != "" {
			if err := sess.Rename(sess.Layout.Ready(m), sess.Layout.Processing(d.cfg.WorkerID, m)); err != nil && !sftpconn.IsNotExist(err) {
				if !sftpconn.IsRefused(err) {
					return claimed{walked: out.walked, raced: out.raced}, fmt.Errorf("claim manifest of %s: %w", in.RemoteName, err)
				}
				if d.manifestRefused(p, sess, in, err) {
					missed.add(in.ClaimedPath, in.ID)
					continue // back in ready/ beside its manifest
				}
			}
			in.ManifestName = m
		}
		pairs = append(pairs, in)
	}
	if renamed = pairs; len(renamed) == 0 {
		return claimed{walked: out.walked, raced: out.raced}, failed
	}
	// recorded in the section's transaction, whose commit ends it: no
	// connection of the work's pool is needed to claim
	out.ins, err = lock.Record(ctx, d.ledger, renamed)
	if err != nil {
		return claimed{walked: out.walked, raced: out.raced}, err
	}
	if len(out.ins) < len(renamed) {
		// a path a live row still owns: the file waits in ready/
		rec := make(map[string]bool, len(out.ins))
		for _, in := range out.ins {
			rec[in.ClaimedPath] = true
		}
		for _, in := range renamed {
			if !rec[in.ClaimedPath] && d.busyClaimPath(p, sess, in) {
				missed.add(in.ClaimedPath, in.ID)
			}
		}
		if len(out.ins) == 0 && out.opening != nil {
			out.opening.Discard() // its file waits in ready/: nothing reads it
			out.opening = nil
		}
	}
	if p.cfg.Readiness == partners.ReadinessStable {
		// the name left ready/: a file written there again under it
		// starts a clock of its own
		for _, in := range out.ins {
			if err := d.ledger.ForgetReady(ctx, p.cfg.ID, in.RemoteName); err != nil {
				return out, err
			}
		}
	}
	keep = true
	return out, failed
}

// rename renames c from ready/ to dst, its path in this worker's
// processing dir; open: with the file opened behind the RENAME
// (RenameAndOpen; nil where the site's answers may come out of order). A
// RENAME that copies answers late: the session's watchdog allows for c's
// size.
func (d *claimStage) rename(sess *sftpconn.Session, c candidate, dst string, open bool) (*sftpconn.Opening, error) {
	src := sess.Layout.Ready(c.Name)
	copied := sess.AllowCopy(c.Size)
	defer copied()
	if open {
		return sess.RenameAndOpen(src, dst)
	}
	return nil, sess.Rename(src, dst)
}

// manifestRefused handles a claimed file whose manifest the site refused
// to move beside it (a permission, or a refusal of the moment: the
// partner's upload still open). The file goes back into ready/ beside its
// manifest (back: true), refused as its own move would be (claimRefused:
// passed over a while, then tried again); if even that fails it is
// recorded without its manifest, and its download holds it
// (manifest_invalid, saying the manifest stayed in ready/). Either way the
// partner's other files go on.
func (d *claimStage) manifestRefused(p *partnerRT, sess *sftpconn.Session, in *ledger.Intake, err error) (back bool) {
	if berr := putBackRefused(p, sess, in.ClaimedPath, in.RemoteName, in.ListedSize); berr != nil {
		d.log.Warn("the site refused to move a claimed file's manifest beside it, and the file could not go back beside it; the file is held (manifest_invalid)",
			"partner", p.cfg.ID, "file", printableName(in.RemoteName), "reason", reason.ManifestInvalid, "err", err, "back_err", berr)
		return false
	}
	d.claimRefused(p, in.RemoteName+partners.ManifestSuffix, err)
	return true
}

// putBackRefused moves a claimed data file at from back into ready/ as
// name, beside the manifest the site refused to move, and has the
// partner's listings pass it over a while (readylist.Refusals) as it is
// in ready/ now (a server that stamps a RENAME's time gives it another
// mtime).
func putBackRefused(p *partnerRT, sess *sftpconn.Session, from, name string, size int64) error {
	to := sess.Layout.Ready(name)
	err := sess.RenameSized(from, to, size)
	if err != nil {
		return err
	}
	if fi, err := sess.Lstat(to); err == nil {
		p.refused.Remember(name, fi.Size(), fi.ModTime())
	}
	return nil
}

// claimRefused counts and logs an entry of ready/ whose claim's RENAME
// the site refused (a permission, an immutable file, a folder a gateway
// cannot move): it stays in ready/, passed over by the partner's listings
// for a while (readylist.Refusals) and then tried again, and the
// partner's other entries go on. Its age in ready/ raises
// IntakeReadyBacklog; a hostile one is also the reconciler's finding.
func (d *claimStage) claimRefused(p *partnerRT, name string, err error) {
	d.metrics.Skipped.WithLabelValues(p.cfg.ID, claimRefused).Inc()
	d.log.Warn("the site refused to move an entry of ready/ into processing/; it stays there and the partner's other files go on",
		"partner", p.cfg.ID, "file", printableName(name), "reason", claimRefused, "err", err)
}

// nonNil is in as a slice: empty when nil.
func nonNil(in *ledger.Intake) []*ledger.Intake {
	if in == nil {
		return nil
	}
	return []*ledger.Intake{in}
}

// errPutBack marks a file a racing group put back into ready/.
var errPutBack = errors.New("put back into ready/")

// putBack renames the files a racing group won back into ready/, all at
// once. It returns the group's rename results with every file put back
// marked errPutBack; a file that could not be put back (its name is in
// ready/ again) keeps its nil result and is recorded as claimed. Nothing
// but the rename has happened to these files, so putting them back leaves
// no trace but a log line.
func (d *claimStage) putBack(p *partnerRT, sess *sftpconn.Session, g []candidate, errs []error) []error {
	out := append([]error(nil), errs...)
	back := make([]error, len(g))
	var total int64
	for i, c := range g {
		if errs[i] == nil {
			total += c.Size
		}
	}
	defer sess.AllowCopy(total)() // RENAMEs that copy answer late, one copy after another at worst
	var wg sync.WaitGroup
	for i, c := range g {
		if errs[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			back[i] = sess.Rename(sess.Layout.Processing(d.cfg.WorkerID, c.Name), sess.Layout.Ready(c.Name))
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

// busyClaimPath undoes a claim whose RENAME went through to a path a live
// row still owns (an earlier intake of the name, waiting for a retry with
// its bytes in the spool after its file left processing/): the new file
// goes back into ready/ (with its manifest) to wait until that intake
// ends, counted as skipped claim_target_busy and logged. It is never left
// at the path, where the earlier intake's archive would move it as its
// own. A failed move back leaves it there for resumeOwn to adopt once the
// path is free (the partner is looked through again). It reports whether
// the file went back.
func (d *claimStage) busyClaimPath(p *partnerRT, sess *sftpconn.Session, in *ledger.Intake) bool {
	d.metrics.Skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
	back := func(name string) error {
		err := sess.RenameSized(sess.Layout.Processing(d.cfg.WorkerID, name), sess.Layout.Ready(name), in.ListedSize)
		if err != nil && !sftpconn.IsNotExist(err) {
			return err
		}
		return nil
	}
	err := back(in.RemoteName)
	if err == nil && in.ManifestName != "" {
		err = back(in.ManifestName)
	}
	if err != nil {
		p.takenOver.Store(true)
		d.log.Warn("a new file was claimed to a path an unfinished intake still owns and could not be put back; it is adopted once that intake ends",
			"partner", p.cfg.ID, "reason", claimTargetBusy, "err", err)
		return false
	}
	d.log.Warn("a new file waits in ready/: an unfinished intake of the same name still owns its claim path",
		"partner", p.cfg.ID, "reason", claimTargetBusy)
	return true
}

// keptIDs are claim ids kept for processing paths (ledger.KeepClaimIDs).
type keptIDs struct {
	paths []string
	ids   []int64
}

func (k *keptIDs) add(path string, id int64) {
	k.paths, k.ids = append(k.paths, path), append(k.ids, id)
}

// dropClaimIDs drops the ids a claim kept for paths none of its files
// reached. One left kept does no harm (the next claim or move to its path
// replaces it; retention deletes it): a failure is only logged.
func (d *claimStage) dropClaimIDs(ctx context.Context, p *partnerRT, k keptIDs) {
	if len(k.ids) == 0 {
		return
	}
	if err := d.ledger.DropClaimIDs(ctx, p.cfg.ID, k.paths, k.ids); err != nil {
		d.log.Warn("could not drop the ids a claim kept for files it did not rename", "partner", p.cfg.ID, "err", err)
	}
}

// groupable reports whether a candidate can go through a group: a small
// plain file, with no manifest, whose name gives a batch id, and too small
// to hold more rows than one chunk (a row takes at least one byte per
// column: its delimiters and its line end). Not under readiness stable: a
// file there is checked for changes when its own download ends.
func groupable(p *partners.Config, c candidate, fold bool) bool {
	// an update_only feed's missing keys are rejected rows, which need the
	// per-file rejects report; a snapshot sweeps per file; a feed with an
	// approval policy is planned against its target per file
	return p.Readiness != partners.ReadinessStable && c.Manifest == "" && c.Feed.Mode != partners.ModeUpdateOnly && c.Feed.Mode != partners.ModeSnapshot && !c.Feed.Guarded() && c.Size > 0 && c.Size < siteread.SmallBytes && c.Size <= p.Limits.MaxFileBytes &&
		c.Size <= int64(c.Feed.ChunkRows)*int64(max(len(c.Feed.Columns), 1)) &&
		unwrap.Kind(c.Feed, c.Name) == "" && partners.ValidBatchID(batchIDOf(c.Feed, c.Name, fold))
}

// maxGroupBytes bounds a group's listed bytes: a group holds its files in
// memory while it runs (GroupFiles × 64 KiB at most otherwise).
const maxGroupBytes = 1 << 20

// groupAt returns the group that starts at cands[0]: up to n groupable
// files of one feed with distinct batch ids and maxGroupBytes in all, in
// listing order (oldest first). Fewer than two is no group. fold: the
// partner's server compares names without case (batchIDOf).
func groupAt(p *partners.Config, cands []candidate, n int, fold bool) []candidate {
	n = min(n, p.GroupFiles)
	if n < 2 || !groupable(p, cands[0], fold) {
		return nil
	}
	seen := map[string]bool{}
	var g []candidate
	var bytes int64
	for _, c := range cands {
		if len(g) == n || c.Feed != cands[0].Feed || !groupable(p, c, fold) || bytes+c.Size > maxGroupBytes {
			break
		}
		bytes += c.Size
		b := batchIDOf(c.Feed, c.Name, fold)
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
