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
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

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

// claimGroup claims a group's files (or those of several consecutive
// groups, claimed together: claimLoop.followingGroups) as claim does one
// file: by RENAME, in
// listing order, each under the id allocated for it before the renames
// (both under the partner's claim lock, see ledger.ClaimLock); then one
// statement records every file renamed.
//
// Intake ids must follow file age even when two replicas claim from one
// partner at the same moment (around a change of replicas, or with
// affinity "none"). Renames sent all at once would let a replica win a
// newer file under an id allocated before the other replica's ids for
// older files (TestRacingGroupsKeepIdsInFileAge caught it), so a group's
// ids and renames are one section under the partner's claim lock: every
// other claim of the partner is wholly before or after it. A rename is
// then lost only to a claim made before the section (this poll's listing
// is older than it), and the renames go all at once only while no race
// shows: when one of them is lost, the files this group won are put back
// into ready/ (nothing recorded them yet; inside the section, so no other
// replica sees them gone) and the caller walks the rest of the poll one
// rename at a time (sequential), stopping at the first file not claimed
// and going on from the next with fresh ids, as single claims do.
//
// It returns the claimed rows, how many candidates it went through (0
// after putting the group back: the caller walks them again one at a
// time), whether a race showed, and an error for a rename that failed
// otherwise than by losing a race.
func (d *claimStage) claimGroup(ctx context.Context, p *partnerRT, sess *sftpconn.Session, g []candidate, sequential bool) ([]*ledger.Intake, int, bool, error) {
	if err := d.workerID.StillHeld(ctx); err != nil {
		return nil, 0, false, err
	}
	if err := fault.Check("claim:before_rename"); err != nil {
		return nil, 0, false, fmt.Errorf("claim: %w", err)
	}
	lock, err := d.ledger.LockClaims(ctx, p.cfg.ID)
	if err != nil {
		return nil, 0, false, err
	}
	defer lock.Release()
	ids, err := lock.IntakeIDs(ctx, len(g))
	if err != nil {
		return nil, 0, false, err
	}
	errs := make([]error, len(g))
	walked := len(g)
	if sequential {
		for i, c := range g {
			errs[i] = sess.Rename(sess.Layout.Ready(c.Name), sess.Layout.Processing(d.cfg.WorkerID, c.Name))
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
				errs[i] = sess.Rename(sess.Layout.Ready(c.Name), sess.Layout.Processing(d.cfg.WorkerID, c.Name))
			}()
		}
		wg.Wait()
	}
	raced := false
	for _, err := range errs[:walked] {
		if err != nil && sftpconn.IsNotExist(err) {
			raced = true
			d.metrics.ClaimsLost.WithLabelValues(p.cfg.ID).Inc()
		}
	}
	if raced {
		d.peers.Lost()
	}
	if raced && !sequential {
		kept := d.putBack(p, sess, g, errs)
		if len(kept) == 0 {
			return nil, 0, true, nil
		}
		// a file that could not be put back is recorded as claimed
		errs = kept
	}
	var renamed []*ledger.Intake
	var failed error
	for i, c := range g[:walked] {
		dst := sess.Layout.Processing(d.cfg.WorkerID, c.Name)
		switch err := errs[i]; {
		case err == nil:
			renamed = append(renamed, &ledger.Intake{ID: ids[i], Partner: p.cfg.ID, Feed: c.Feed.Name, RemoteName: c.Name,
				ClaimedPath: dst, ListedSize: c.Size, Worker: d.cfg.WorkerID})
		case sftpconn.IsNotExist(err), errors.Is(err, errPutBack):
		default:
			if _, serr := sess.Lstat(dst); serr == nil {
				d.metrics.Skipped.WithLabelValues(p.cfg.ID, claimTargetBusy).Inc()
			} else if failed == nil {
				failed = fmt.Errorf("claim %s: %w", c.Name, err)
			}
		}
	}
	if raced && !sequential {
		walked = 0
	}
	if err := fault.Check("claim:after_rename"); err != nil {
		// as if the replies were lost: the files sit in our processing
		// dir without rows, and the next poll adopts them
		return nil, walked, raced, fmt.Errorf("claim: %w", err)
	}
	if len(renamed) == 0 {
		return nil, walked, raced, failed
	}
	// recorded in the section's transaction, whose commit ends it: no
	// connection of the work's pool is needed to claim
	claimed, err := lock.Record(ctx, d.ledger, renamed)
	if err != nil {
		return nil, walked, raced, err
	}
	if len(claimed) < len(renamed) {
		// a path a live row still owns: the file waits in ready/
		rec := make(map[string]bool, len(claimed))
		for _, in := range claimed {
			rec[in.ClaimedPath] = true
		}
		for _, in := range renamed {
			if !rec[in.ClaimedPath] {
				d.busyClaimPath(p, sess, in)
			}
		}
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
func (d *claimStage) putBack(p *partnerRT, sess *sftpconn.Session, g []candidate, errs []error) []error {
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
