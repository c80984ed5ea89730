package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Claims without a row (matrix row 1). A worker killed
// between its claim RENAME and the row's INSERT leaves the file in
// processing/<worker>/ with no row: no lease expires for it, so nothing
// but a look into that directory finds it. Three look:
//
//   - the worker itself, restarted: resumeOwn adopts every entry of its
//     own directory (on every poll of a partner it polls until the partner
//     is settled again after a failed poll, a move of adoptOrphans or a
//     start, and once after start for the others unless its previous run
//     ended drained, which it records only when it has looked at every
//     partner: Daemon.Stop);
//   - whoever polls the partner, whatever the affinity: the directories of
//     workers known to be gone (crashed past their lease, or retired) are
//     moved into its own, where resumeOwn adopts them (adoptOrphans); a
//     worker id that never registered (`run --once`) is left to the
//     reconciler;
//   - the reconciler, which does the same and reports every entry without
//     a row it leaves behind (a live worker's) as a finding and in
//     intake_orphan_claims.
//
// A live worker's directory is left to that worker: it may be between a
// claim's RENAME and its INSERT right now.

// orphanAdopter takes claims without a row over: stopped workers'
// (adoptOrphans) and this worker's own (adoptOwn).
type orphanAdopter struct {
	ledger   *ledger.Ledger
	workerID string
	lease    time.Duration
	metrics  *metrics.Set
	log      *slog.Logger
}

// sweepDue reports whether the partner's poller looks through the other
// workers' directories now (one READDIR of processing/ and one per
// worker): at most every third of a lease.
func (o *orphanAdopter) sweepDue(p *partnerRT) bool {
	return time.Since(p.orphanSweep) >= max(o.lease/3, time.Second)
}

// adoptOrphans moves the entries of every processing/<w>/ whose worker is
// known to be gone, and that no live row owns, into this worker's processing dir;
// resumeOwn then records them as claims. The RENAME is the claim here as
// anywhere: of two replicas sweeping at once, one gets each file.
func (o *orphanAdopter) adoptOrphans(ctx context.Context, p *partnerRT, sess *sftpconn.Session) error {
	if !o.sweepDue(p) {
		return nil
	}
	base := path.Dir(sess.Layout.ProcessingDir(o.workerID))
	dirs, err := sess.ReadDir(base)
	if err != nil {
		return fmt.Errorf("list %s: %w", base, err)
	}
	for _, dir := range dirs {
		w := dir.Name()
		if !dir.IsDir() || w == o.workerID || strings.HasPrefix(w, ".") {
			continue
		}
		gone, err := o.ledger.WorkerGone(ctx, w)
		if err != nil {
			return err
		}
		if !gone {
			continue
		}
		if err := o.adoptFrom(ctx, p, sess, w); err != nil {
			return err
		}
	}
	p.orphanSweep = time.Now()
	return nil
}

// adoptFrom moves a gone worker's entries without a live row into this
// worker's processing dir (a manifest with its data file).
func (o *orphanAdopter) adoptFrom(ctx context.Context, p *partnerRT, sess *sftpconn.Session, w string) error {
	dir := sess.Layout.ProcessingDir(w)
	ents, err := sess.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	if len(ents) == 0 {
		return nil
	}
	// the moves below are writes: none on a site whose preparation
	// failed (sftpconn.ErrNotPrepared fails the poll)
	if err := sess.Prepared(); err != nil {
		return err
	}
	// The rows are read, and the entries moved, in the partner's claim
	// section: no takeover moves a file of w's between that look and
	// these moves, however long this replica paused since its listing.
	return o.ledger.InClaimSection(ctx, p.cfg.ID, func(*ledger.ClaimLock) error {
		return o.move(ctx, p, sess, w, ents)
	})
}

// moveOrphans is adoptFrom's moves, in the partner's claim section.
func (o *orphanAdopter) move(ctx context.Context, p *partnerRT, sess *sftpconn.Session, w string, ents []os.FileInfo) error {
	if err := fault.Check("adopt:before_move"); err != nil {
		return err
	}
	dir := sess.Layout.ProcessingDir(w)
	paths := make([]string, 0, len(ents))
	for _, e := range ents {
		paths = append(paths, path.Join(dir, e.Name()))
	}
	owned, err := o.ledger.LivePaths(ctx, p.cfg.ID, paths)
	if err != nil {
		return err
	}
	manifests := p.cfg.Readiness == partners.ReadinessManifest
	for _, e := range ents {
		name := e.Name()
		old := path.Join(dir, name)
		if owned[old] {
			continue // a live row: the reconciler takes it over when its lease expires
		}
		dstName := name
		if !strings.HasPrefix(name, partners.HostilePrefix) {
			if strings.HasPrefix(name, ".") {
				continue // not a claim (a temp file, a profile's probe)
			}
			if manifests && strings.HasSuffix(name, partners.ManifestSuffix) && e.Mode().IsRegular() {
				continue // moves with its data file
			}
			if why := p.cfg.ClaimedHostile(e); why != "" {
				// not a file of a feed (any more): held unread under a
				// generated name, as a hostile entry of ready/ is
				dstName = partners.HostileName(why)
			} else if p.cfg.Readiness == partners.ReadinessStable {
				// the worker ended its intake put_back and stopped before
				// the rename back into ready/ (stable.go): finish that
				back, err := o.ledger.WasPutBack(ctx, p.cfg.ID, old)
				if err != nil {
					return err
				}
				if back {
					finishPutBack(o.log, p, sess, old, name, e.Size())
					continue
				}
			}
		}
		dst := sess.Layout.Processing(o.workerID, dstName)
		// the id its claim kept goes with it, committed before the move (a
		// hostile entry, held under a generated name, has none)
		carried := dstName != name
		if !carried {
			var err error
			if carried, err = o.ledger.CarryClaimID(ctx, p.cfg.ID, old, dst); err != nil {
				return err
			}
		}
		p.settled = false // an entry without a row may land in our dir now: resumeOwn must look
		p.adoptMoves++
		err := sess.RenameSized(old, dst, e.Size())
		if err != nil {
			if sftpconn.IsNotExist(err) {
				continue // another replica took it first
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			o.log.Warn("could not adopt a claim without a row", "partner", p.cfg.ID, "path", old, "err", err)
			continue
		}
		if !carried {
			// dst held an id of its own (a claim that never renamed a
			// file there), or old kept none
			if err := o.ledger.CarriedClaimID(ctx, p.cfg.ID, old, dst); err != nil {
				o.log.Warn("could not carry a claim's id with its file; its adoption may take another claim's id", "partner", p.cfg.ID, "path", old, "err", err)
			}
		}
		if manifests && !strings.HasPrefix(dstName, partners.HostilePrefix) {
			_, err := sitefile.ClaimManifest(sess, dst, dir, sess.Layout.ReadyDir())
			if sftpconn.IsRefused(err) {
				// the site refuses to move its manifest out of the stopped
				// worker's dir (every sweep would meet that again): the
				// file stays adopted and its download holds it
				// (manifest_invalid); the manifest left there is the
				// reconciler's finding
				o.log.Warn("the site refused to move an adopted file's manifest; the file is held (manifest_invalid)", "partner", p.cfg.ID, "path", old+partners.ManifestSuffix, "err", err)
			} else if err != nil {
				// the file goes back beside its manifest: the next
				// adoption moves both (adoptOwn looks in ready/ only)
				o.log.Warn("could not move a manifest with its adopted file; the file is left where it was", "partner", p.cfg.ID, "path", old+partners.ManifestSuffix, "err", err)
				uerr := sess.RenameSized(dst, old, e.Size())
				if uerr != nil {
					o.log.Warn("could not move the file back beside its manifest; its download holds it", "partner", p.cfg.ID, "path", dst, "err", uerr)
				}
				continue
			}
		}
		o.log.Info("took over a claim without a row from a stopped worker", "partner", p.cfg.ID, "from_worker", w, "path", old)
		o.metrics.OrphansAdopted.WithLabelValues(p.cfg.ID).Inc()
	}
	return nil
}

// adoptOwn records a claim for each entry of this worker's processing dir
// listed without a live row (cands), and returns how many it recorded. The
// listing may be from before a pause in which another replica took the
// files over and moved them, or finished them: each entry is looked at
// again (LSTAT) inside the partner's claim section, where no takeover
// moves a file, and recorded there only if it is still in place and no
// live row owns its path (ledger.InClaimSection). An entry gone by then
// was never this worker's to adopt: it gets no row, so no receipt, no
// reason file and no count as failed; it is logged and counted
// (intake_orphan_claims_vanished_total).
func (o *orphanAdopter) adoptOwn(ctx context.Context, p *partnerRT, sess *sftpconn.Session, cands []*ledger.Intake, hold map[string]reason.Code) (int, error) {
	if len(cands) == 0 {
		return 0, nil
	}
	paths := make([]string, len(cands))
	for i, in := range cands {
		paths[i] = in.ClaimedPath
	}
	// entries with a live row are the rows' to resume (a restart): no
	// section is entered for them
	owned, err := o.ledger.LivePaths(ctx, p.cfg.ID, paths)
	if err != nil {
		return 0, err
	}
	var orphans []*ledger.Intake
	for _, in := range cands {
		if !owned[in.ClaimedPath] {
			orphans = append(orphans, in)
		}
	}
	if len(orphans) == 0 {
		return 0, nil
	}
	if err := fault.Check("resume:orphan"); err != nil {
		return 0, err
	}
	var recorded []*ledger.Intake
	var vanished int
	err = o.ledger.InClaimSection(ctx, p.cfg.ID, func(c *ledger.ClaimLock) error {
		recorded, vanished = recorded[:0], 0
		for _, in := range orphans {
			fi, err := sess.Lstat(in.ClaimedPath)
			if sftpconn.IsNotExist(err) {
				vanished++
				continue
			}
			if err != nil {
				return fmt.Errorf("look at %s again: %w", in.ClaimedPath, err)
			}
			why := hold[in.ClaimedPath]
			if why == "" && in.Feed != ledger.NoFeed && !fi.Mode().IsRegular() {
				why = reason.NotRegularFile // swapped between the listing and the claim's RENAME
			}
			if why != "" {
				// held unread under a generated name, as a hostile entry
				// of ready/ is (the name never enters our paths again)
				held := path.Join(path.Dir(in.ClaimedPath), partners.HostileName(why))
				err := sess.RenameSized(in.ClaimedPath, held, fi.Size())
				if err != nil {
					if sftpconn.IsNotExist(err) {
						vanished++
						continue
					}
					return fmt.Errorf("hold %s: %w", in.ClaimedPath, err)
				}
				in.Feed, in.ClaimedPath, in.ListedSize, in.ManifestName = ledger.NoFeed, held, fi.Size(), ""
			}
			if in.Feed != ledger.NoFeed {
				in.ListedSize, in.ListedMTime = fi.Size(), fi.ModTime()
				if p.cfg.Readiness == partners.ReadinessManifest && in.ManifestName == "" {
					// the claim's RENAME of the file went through and its
					// manifest's did not (a crash between the two): the
					// manifest is taken from ready/ now
					if in.ManifestName, err = sitefile.ClaimManifest(sess, in.ClaimedPath, sess.Layout.ReadyDir()); sftpconn.IsRefused(err) {
						// the site refuses to move the manifest: the file
						// goes back into ready/ beside it, passed over a
						// while (as a claim's, manifestRefused); recorded
						// only when it cannot, and its download holds it
						if putBackRefused(p, sess, in.ClaimedPath, in.RemoteName, in.ListedSize) == nil {
							o.log.Warn("the site refused to move an adopted file's manifest beside it; the file is back in ready/", "partner", p.cfg.ID, "file", printableName(in.RemoteName), "err", err)
							continue
						}
					} else if err != nil {
						return err
					}
				}
			}
			if err := fault.Check("resume:before_insert"); err != nil {
				return err
			}
			// recorded under the id its claim kept for the path: its
			// place among the partner's claims (ledger.KeepClaimIDs)
			err = c.Adopt(ctx, o.ledger, in)
			if errors.Is(err, ledger.ErrTracked) {
				continue // a live row owns the path: it is that row's to resume
			}
			if err != nil {
				return err
			}
			recorded = append(recorded, in)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if vanished > 0 {
		o.log.Info("entries listed in this worker's processing dir without a row were gone when looked at again; another replica took them over", "partner", p.cfg.ID, "count", vanished)
		o.metrics.OrphansVanished.WithLabelValues(p.cfg.ID).Add(float64(vanished))
	}
	for _, in := range recorded {
		o.log.Info("adopted a claimed file without a row", "partner", p.cfg.ID, "intake_id", in.ID)
	}
	return len(recorded), nil
}
