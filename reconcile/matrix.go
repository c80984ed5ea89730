package reconcile

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// Rows of the failure matrix (docs/failure-matrix.md) that need a periodic
// look. Rows the pipeline handles inline (2, 3, 6, 7, 8, 11, 16) are not
// here; the doc says where each lives.

type addFunc func(ledger.Finding)

// unclaimableAfter is how long a hostile entry may sit in ready/ before the
// reconciler says that moving it to quarantine failed.
const unclaimableAfter = 10 * time.Minute

// maxFindingsPerKind bounds what one run stores and logs of one kind of
// finding for one partner (a site with 100 000 stale uploads or hostile
// entries in ready/): the first ones, then one finding that counts the
// rest.
const maxFindingsPerKind = 100

// partner runs every row for one partner.
func (r *Reconciler) partner(ctx context.Context, p *partners.Config) ([]ledger.Finding, error) {
	fs := newFindingSet(p.ID, maxFindingsPerKind)
	err := r.partnerRows(ctx, p, fs)
	return fs.list(), err
}

// findingSet is one partner's findings of a run, bounded as they come:
// the first max of each kind, then one finding more for a kind that had
// more, counting them (it needs a human when one of them did). A site
// with millions of stale uploads or hostile entries costs the run a
// count, not a list.
type findingSet struct {
	partner string
	max     int
	out     []ledger.Finding
	seen    map[string]int
	over    map[string]*ledger.Finding
	kinds   []string // the kinds that went over, in that order
}

func newFindingSet(partner string, max int) *findingSet {
	return &findingSet{partner: partner, max: max, seen: map[string]int{}, over: map[string]*ledger.Finding{}}
}

// add is the rows' addFunc.
func (s *findingSet) add(f ledger.Finding) {
	f.Partner = s.partner
	s.seen[f.Kind]++
	if s.seen[f.Kind] <= s.max {
		s.out = append(s.out, f)
		return
	}
	s.more(f.Kind, 0, f.NeedsHuman)
}

// more counts n findings of kind beyond those added one by one (a row
// that kept only the first of them), besides the one that went over.
func (s *findingSet) more(kind string, n int, needsHuman bool) {
	s.seen[kind] += n
	o := s.over[kind]
	if o == nil {
		o = &ledger.Finding{Kind: kind, Partner: s.partner, Action: "none"}
		s.over[kind] = o
		s.kinds = append(s.kinds, kind)
	}
	o.NeedsHuman = o.NeedsHuman || needsHuman
}

// list is the findings kept, then each kind's count of the rest.
func (s *findingSet) list() []ledger.Finding {
	out := s.out
	for _, k := range s.kinds {
		o := *s.over[k]
		o.Detail = fmt.Sprintf("%d more findings of this kind this run, not listed one by one", s.seen[k]-s.max)
		out = append(out, o)
	}
	return out
}

// partnerRows runs every row for one partner, into fs.
func (r *Reconciler) partnerRows(ctx context.Context, p *partners.Config, fs *findingSet) error {
	add := fs.add
	var errs []error
	// Database- and spool-only rows run even when the site is down.
	errs = append(errs, r.rowOutcomeUnknown(ctx, p, add), r.rowStaleSpoolTemp(p, add), r.openQuarantine(ctx, p, add))
	sess, err := sftpconn.Dial(ctx, p)
	if err != nil {
		r.rowPartnerUnreachable(err, add)
		return errors.Join(errs...)
	}
	defer sess.Close()
	stop := sess.CloseWhenDone(ctx) // the partner's deadline (reconciler.go)
	defer stop()
	// The takeovers' renames never overwrite: on a server whose RENAME
	// would, as its profile says, or not measured yet, the session makes
	// sure of each target itself (sftpconn.Session.SetRenameOverwrites:
	// the takeovers move files into processing/ in the claim section)
	prof, err := r.ledger.SiteProfile(ctx, p.ID)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	sess.SetRenameOverwrites(prof == nil || prof.Profile.RenameOverwrites)
	sess.SetEmptyDirsVanish(prof != nil && !prof.Profile.EmptyDirPersists)
	if p.Records() {
		// claim: record (a read-only site): nothing was moved or written
		// there, so the rows about processing/, archive/, quarantine/ and
		// published reports have nothing to look at; expired leases are
		// taken over without a move
		errs = append(errs,
			r.rowExpiredLeases(ctx, p, sess, add),
			r.rowStaleUploads(ctx, p, sess, add),
			r.rowUnclaimableReady(ctx, p, sess, add, fs.more),
		)
		return errors.Join(errs...)
	}
	if _, err := sftpconn.EnsureDirs(sess.Client, sess.Layout, r.worker); err != nil {
		return errors.Join(append(errs, err)...)
	}
	errs = append(errs,
		r.rowOrphanClaims(ctx, p, sess, add),
		r.rowExpiredLeases(ctx, p, sess, add),
		r.rowArchiveWithoutRecord(ctx, p, sess, add),
		r.rowQuarantineWithoutRecord(ctx, p, sess, add),
		r.rowStaleUploads(ctx, p, sess, add),
		r.rowUnclaimableReady(ctx, p, sess, add, fs.more),
		r.rowStaleRemoteTemps(ctx, p, sess, add),
		r.rowUnpublishedDiscards(ctx, p, sess, add),
	)
	return errors.Join(errs...)
}

// Row 1: crash after the claim rename, before the row: a file in
// processing/<w>/ that no live row owns. When w is gone (past its lease,
// or retired), the file is moved into processing/<this worker>/ and a
// claimed row is inserted. When w is this worker or still alive, w adopts
// it itself when it next looks at the partner; until then the file is
// reported (it has no outcome yet, and a worker that never looks would
// leave it so for good). A live worker may be between a
// claim's RENAME and its INSERT right now, so such an entry is looked up
// again after every directory was listed, in the partner's claim section
// (where a claim's RENAME and its row are one step), and reported only if
// still there without a row. A hostile entry (partners.HostilePrefix: what a claim took
// out of ready/ under a generated name, a directory or a symlink as well)
// is adopted whatever it is, to be held unread. A manifest travels with
// its data file; one found beside none is looked at after the listings
// (strayManifest).
func (r *Reconciler) rowOrphanClaims(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	base := path.Join(s.Layout.Root, s.Layout.Dirs.Processing)
	dirs, err := s.ReadDir(base)
	if err != nil {
		return fmt.Errorf("list %s: %w", base, err)
	}
	type leftTo struct{ path, worker string }
	var left []leftTo
	var manifests []string // beside no data file: looked at again at the end
	for _, d := range dirs {
		w := d.Name()
		if !d.IsDir() {
			continue
		}
		alive := w == r.worker
		if !alive {
			if alive, err = r.ledger.WorkerAlive(ctx, w); err != nil {
				return err
			}
		}
		if alive {
			files, err := s.ReadDir(path.Join(base, w))
			if err != nil {
				return err
			}
			manifests = append(manifests, strayManifests(p, path.Join(base, w), files)...)
			for _, f := range files {
				name := f.Name()
				if strings.HasPrefix(name, ".") || (p.Readiness == partners.ReadinessManifest && strings.HasSuffix(name, partners.ManifestSuffix)) {
					continue
				}
				old := path.Join(base, w, name)
				if owned, err := r.ledger.Owned(ctx, p.ID, old); err != nil {
					return err
				} else if !owned {
					left = append(left, leftTo{old, w})
				}
			}
			continue
		}
		files, err := s.ReadDir(path.Join(base, w))
		if err != nil {
			return err
		}
		manifests = append(manifests, strayManifests(p, path.Join(base, w), files)...)
		for _, f := range files {
			name := f.Name()
			// a hostile entry (a symlink, a directory, whatever the claim
			// took out of ready/ under a generated name) is held whatever
			// it is, never read
			hostile := strings.HasPrefix(name, partners.HostilePrefix)
			if !hostile && strings.HasPrefix(name, ".") {
				continue // not a claim (a temp file, a profile's probe)
			}
			if !hostile && p.Readiness == partners.ReadinessManifest && strings.HasSuffix(name, partners.ManifestSuffix) && f.Mode().IsRegular() {
				continue // moves with its data file (strayManifests: one beside none)
			}
			old := path.Join(base, w, name)
			owned, err := r.ledger.Owned(ctx, p.ID, old)
			if err != nil {
				return err
			}
			if owned {
				continue // a live row: the expired-lease row handles it
			}
			feedName := ledger.NoFeed // a hostile entry: it is held, never read
			dstName := name
			if !hostile {
				if why := p.ClaimedHostile(f); why != "" {
					// not a file of a feed (any more: a feed removed or
					// re-patterned, an entry swapped before the claim's
					// RENAME): held unread under a generated name
					dstName = partners.HostileName(why)
					if !partners.SafeName(name) {
						name = dstName // the row names no unsafe name either
					}
				} else {
					feedName = p.FeedFor(name).Name
				}
			}
			dst := s.Layout.Processing(r.worker, dstName)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The move and the row go together even when the run is being
			// stopped: a stop that drained leaves no claim without a row
			// (intake/affinity.go relies on that). Only a crash can.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			err = r.adopt(actx, p, s, old, dst, name, feedName, f.Size(), w, add)
			cancel()
			if err != nil {
				return err
			}
		}
	}
	for _, l := range left {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// looked at again in the partner's claim section, where a claim's
		// RENAME and its row are one step: a claim in progress at the
		// listing has its row by then
		var found bool
		err := r.ledger.InClaimSection(ctx, p.ID, func(*ledger.ClaimLock) error {
			if _, err := s.Lstat(l.path); err != nil {
				return nil // adopted or moved on meanwhile
			}
			owned, err := r.ledger.Owned(ctx, p.ID, l.path)
			found = err == nil && !owned
			return err
		})
		if err != nil {
			return err
		}
		if found {
			add(ledger.Finding{Kind: ledger.KindOrphanClaim, Path: l.path, NeedsHuman: true, Action: "none",
				Detail: fmt.Sprintf("no row: worker %s is live and adopts it when it next looks at the partner; if this stays, restart that worker", l.worker)})
		}
	}
	for _, m := range manifests {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := r.strayManifest(ctx, p, s, m, add); err != nil {
			return err
		}
	}
	return nil
}

// strayManifests lists the manifests (manifest readiness) of a listing of
// the processing dir dir that lie beside no data file of their name. A
// manifest travels beside its data file, the file first: one alone was
// left by a move that took its file on without it (a takeover's or an
// adoption's whose move of the manifest failed), or lies where its row
// looks for it under another name (a released file's). strayManifest
// looks at each again.
func strayManifests(p *partners.Config, dir string, files []os.FileInfo) []string {
	if p.Readiness != partners.ReadinessManifest {
		return nil
	}
	names := make(map[string]bool, len(files))
	for _, f := range files {
		names[f.Name()] = true
	}
	var out []string
	for _, f := range files {
		name := f.Name()
		if strings.HasPrefix(name, ".") || !partners.SafeName(name) || !strings.HasSuffix(name, partners.ManifestSuffix) ||
			names[strings.TrimSuffix(name, partners.ManifestSuffix)] {
			continue
		}
		out = append(out, path.Join(dir, name))
	}
	return out
}

// strayManifest: a manifest found in processing/ beside no data file
// (strayManifests), looked at again in the partner's claim section, where
// no takeover or adoption moves a file or its manifest: the rows first,
// then the site (an owner moves a file and its manifest before it records
// where they went). One that no row owning its claimed path looks for
// there, and that is still there beside no file, is a leftover: it is
// moved beside the file of the one such row that names it and lacks it
// (where its file went: sitefile.MoveClaimed left it), else reported for a
// human. Nothing else moves it: no finder takes a manifest on its own.
func (r *Reconciler) strayManifest(ctx context.Context, p *partners.Config, s *sftpconn.Session, m string, add addFunc) error {
	dir, name := path.Dir(m), path.Base(m)
	return r.ledger.InClaimSection(ctx, p.ID, func(*ledger.ClaimLock) error {
		rows, err := r.ledger.NamingManifest(ctx, p.ID, name)
		if err != nil {
			return err
		}
		for _, in := range rows {
			if path.Dir(in.ClaimedPath) == dir {
				return nil // its row's, where the row looks for it
			}
		}
		if _, err := s.Lstat(m); sftpconn.IsNotExist(err) {
			return nil // moved on meanwhile
		} else if err != nil {
			return err
		}
		if _, err := s.Lstat(strings.TrimSuffix(m, partners.ManifestSuffix)); err == nil {
			return nil // its file is beside it again: the file's own handling takes both
		} else if !sftpconn.IsNotExist(err) {
			return err
		}
		var lacking []*ledger.Intake
		for _, in := range rows {
			// the row's file at its path, without its manifest beside it
			if _, err := s.Lstat(in.ClaimedPath); sftpconn.IsNotExist(err) {
				continue
			} else if err != nil {
				return err
			}
			if _, err := s.Lstat(path.Join(path.Dir(in.ClaimedPath), name)); err == nil {
				continue
			} else if !sftpconn.IsNotExist(err) {
				return err
			}
			lacking = append(lacking, in)
		}
		if len(lacking) != 1 {
			add(ledger.Finding{Kind: ledger.KindOrphanClaim, Path: m, NeedsHuman: true, Action: "none",
				Detail: "a manifest beside no file, which no live row looks for here: a move left it behind; find its file (the manifest gives its bytes and sha256) and move or remove it by hand"})
			return nil
		}
		in := lacking[0]
		dst := path.Join(path.Dir(in.ClaimedPath), name)
		if err := sitefile.MoveClaim(s, m, dst); err != nil {
			add(ledger.Finding{Kind: ledger.KindOrphanClaim, Path: m, NeedsHuman: true, Action: "none",
				Detail: fmt.Sprintf("a manifest left apart from its file (intake %d at %s) could not be moved beside it (the next run tries again): %s", in.ID, in.ClaimedPath, pgerr.Redact(err))})
			return nil
		}
		add(ledger.Finding{Kind: ledger.KindOrphanClaim, IntakeID: in.ID, Path: m,
			Action: "moved beside its file at " + dst + ", which a move had left it apart from"})
		return nil
	})
}

// adopt moves one orphaned claim into this worker's processing dir and
// records it (matrix row 1), in the partner's claim section: the row that
// the listing found missing is looked for again there, where no takeover
// moves a file, and the row is committed with the section. A file whose
// intake ended put_back is put back into ready/ instead.
func (r *Reconciler) adopt(ctx context.Context, p *partners.Config, s *sftpconn.Session, old, dst, name, feedName string, size int64, w string, add addFunc) error {
	return r.ledger.InClaimSection(ctx, p.ID, func(c *ledger.ClaimLock) error {
		if !r.served(p.ID) {
			return nil // a reload is removing the partner: another replica adopts it
		}
		owned, err := r.ledger.Owned(ctx, p.ID, old)
		if err != nil || owned {
			return err // owned: a live row, the expired-lease row handles it
		}
		if p.Readiness == partners.ReadinessStable && feedName != ledger.NoFeed {
			back, err := r.ledger.WasPutBack(ctx, p.ID, old)
			if err != nil {
				return err
			}
			if back {
				finishPutBack(s, old, name, size, add)
				return nil
			}
		}
		return r.adoptLocked(ctx, c, p, s, old, dst, name, feedName, size, w, add)
	})
}

// finishPutBack: the gone worker ended the file's intake put_back (it
// changed after its claim) and died before the rename back into ready/;
// the put back is finished, the file not taken. A rename back that fails
// is tried again at the next run.
func finishPutBack(s *sftpconn.Session, old, name string, size int64, add addFunc) {
	if err := sitefile.PutBack(s, old, name, size); err != nil {
		add(ledger.Finding{Kind: ledger.KindTakeoverBlocked, Path: old, Action: "none",
			Detail: fmt.Sprintf("its intake was put back (it changed after its claim) and it could not be renamed back into ready/ (the next run tries again): %v", err)})
	}
}

func (r *Reconciler) adoptLocked(ctx context.Context, c *ledger.ClaimLock, p *partners.Config, s *sftpconn.Session, old, dst, name, feedName string, size int64, w string, add addFunc) error {
	if err := fault.Check("adopt_gone:before_move"); err != nil {
		return err
	}
	// a reconciler paused past a lease since its look has lost the
	// section (its session ended): the gone worker's process may have
	// come back and adopted the file in a section of its own meanwhile
	if err := c.StillHeld(ctx); err != nil {
		return err
	}
	// the id the gone worker's claim kept for the file goes with it,
	// committed before the move: the file is recorded under it (its place
	// among the partner's claims)
	carried, err := r.ledger.CarryClaimID(ctx, p.ID, old, dst)
	if err != nil {
		return err
	}
	err = s.RenameSized(old, dst, size)
	if err == nil && !carried {
		// dst held an id of its own (a claim that never renamed a file
		// there), or old kept none
		if cerr := r.ledger.CarriedClaimID(ctx, p.ID, old, dst); cerr != nil {
			r.log.Warn("could not carry a claim's id with its file; its adoption may take another claim's id", "partner", p.ID, "path", old, "err", cerr)
		}
	}
	if err != nil {
		add(ledger.Finding{Kind: ledger.KindTakeoverBlocked, Path: old, NeedsHuman: !sftpconn.IsNotExist(err),
			Action: "none", Detail: fmt.Sprintf("could not move it into processing/%s/: %v", r.worker, err)})
		// the rename may have happened (its reply lost): this worker's
		// poller looks through its own processing/ again and adopts what
		// it finds there without a row
		r.takenOver(p.ID)
		return nil
	}
	in := &ledger.Intake{Partner: p.ID, Feed: feedName, RemoteName: name, ClaimedPath: dst,
		ListedSize: size, Worker: r.worker}
	if p.Readiness == partners.ReadinessManifest && feedName != ledger.NoFeed {
		// beside the file in the gone worker's dir, or still in ready/
		// (it died between the claim's two RENAMEs)
		m, err := sitefile.ClaimManifest(s, dst, path.Dir(old), s.Layout.ReadyDir())
		if err != nil {
			// the file goes back beside its manifest, for the next run
			uerr := s.RenameSized(dst, old, size)
			if uerr != nil {
				r.takenOver(p.ID) // the file is in this worker's processing/ without a row: its poller adopts it
			}
			return err
		}
		in.ManifestName = m
	}
	if err := c.Adopt(ctx, r.ledger, in); err != nil {
		r.takenOver(p.ID) // the file is in this worker's processing/ without a row: its poller adopts it
		if errors.Is(err, ledger.ErrTracked) {
			return &ledger.FencedError{Step: "adopt: a live row already owns " + in.ClaimedPath}
		}
		return err
	}
	add(ledger.Finding{Kind: ledger.KindOrphanClaim, IntakeID: in.ID, Path: old,
		Action: fmt.Sprintf("adopted into processing/%s/ (worker %s is gone)", r.worker, w)})
	r.takenOver(p.ID)
	return nil
}

// Rows 4, 5, 10 (and 12 found on the way): a live row whose lease expired:
// the worker died mid-download, mid-apply, or after commit before archive,
// or is alive but stalled. The row is taken over with a new fencing token
// (the stalled owner's later writes are refused), then the file is renamed
// into processing/<this worker>/ (its SFTP operations fail from then on).
// The taking worker resumes it from its state: never re-applying committed
// chunks, re-downloading from processing/ or continuing from the spool.
func (r *Reconciler) rowExpiredLeases(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	rows, err := r.ledger.Expired(ctx, p.ID)
	if err != nil {
		return err
	}
	var own []int64
	defer func() {
		// This worker's own rows whose lease ran out: its own daemon
		// resumes them, told to look once one is due (a replica that
		// another replica polls the partner for would otherwise leave
		// them alone for as long as this one leads the reconcile runs)
		if len(own) == 0 {
			return
		}
		if due, err := r.ledger.AnyDue(ctx, own); err == nil && due {
			r.takenOver(p.ID)
		}
	}()
	for _, old := range rows {
		if old.Worker == r.worker {
			own = append(own, old.ID)
			continue
		}
		name := old.RemoteName
		if old.Feed == ledger.NoFeed {
			name = path.Base(old.ClaimedPath) // a hostile entry's name never enters our paths: keep its generated one
		}
		dst := s.Layout.Processing(r.worker, name)
		if p.Records() || old.ReplayOf != 0 {
			// claim: record: the file stays where it is; a replay has no
			// remote file (its bytes are the spool's)
			dst = old.ClaimedPath
		}
		// The takeover's statement and its move are one step in the
		// partner's claim section: an adopter never sees the file at its
		// old path with no live row there (ledger.InClaimSection). What
		// it found, and the hint to this worker's poller, count once the
		// section has committed.
		var found []ledger.Finding
		taken := false
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The section runs to its commit even when the run is being
		// stopped or the partner's deadline passes once the move has
		// begun: a move that landed with its takeover rolled back leaves
		// the file in this worker's processing/ with no row, its old row
		// naming where it was, and adopted as a second intake. A stop
		// before the move (ctx) still moves nothing. The move is bounded
		// by the session's own timeouts, the statements by the server's.
		sctx := context.WithoutCancel(ctx)
		err := r.ledger.InClaimSection(sctx, p.ID, func(c *ledger.ClaimLock) error {
			found, taken = found[:0], false
			if !r.served(p.ID) {
				return nil // a reload is removing the partner: another replica takes it over
			}
			note := func(f ledger.Finding) { found = append(found, f) }
			var err error
			taken, err = r.takeOverExpired(sctx, ctx.Err, c, p, s, old, dst, note)
			return err
		})
		if err != nil {
			return err
		}
		for _, f := range found {
			add(f)
		}
		if taken {
			r.takenOver(p.ID)
		}
	}
	return nil
}

// takeOverExpired takes one expired row over and moves its file into
// this worker's processing dir, in the partner's claim section c (both
// commit with it); taken: the row is this worker's once c commits.
//
// ctx is the section's, which the run's stop does not end; stopped is the
// run's: a stop before the move moves nothing.
func (r *Reconciler) takeOverExpired(ctx context.Context, stopped func() error, c *ledger.ClaimLock, p *partners.Config, s *sftpconn.Session, old *ledger.Intake, dst string, add addFunc) (taken bool, err error) {
	in, err := c.TakeOver(ctx, r.ledger, old, r.worker, dst)
	var fe *ledger.FencedError
	if errors.As(err, &fe) {
		return false, nil // renewed or taken meanwhile
	}
	if ledger.PathHeld(err) {
		// a live file of the same name holds its place in this worker's
		// processing dir (the name sent again): taken once that is done
		add(ledger.Finding{Kind: ledger.KindTakeoverBlocked, IntakeID: old.ID, Path: old.ClaimedPath, Action: "none",
			Detail: "waits: a live file of its name holds " + dst})
		return false, nil
	}
	if err != nil {
		add(ledger.Finding{Kind: ledger.KindTakeoverBlocked, IntakeID: old.ID, Path: old.ClaimedPath, NeedsHuman: true,
			Action: "none", Detail: pgerr.Redact(err)})
		return false, nil
	}
	f := ledger.Finding{Kind: ledger.KindLeaseExpired, IntakeID: in.ID, Path: old.ClaimedPath,
		Action: fmt.Sprintf("taken over from %s in state %s with fencing token %d", old.Worker, old.State, in.Token)}
	if p.Records() || old.ReplayOf != 0 {
		add(f)
		return true, nil
	}
	if err := fault.Check("takeover:before_move"); err != nil {
		return false, err
	}
	if err := stopped(); err != nil {
		return false, err
	}
	if err := c.StillHeld(ctx); err != nil {
		return false, err
	}
	var left *sitefile.ManifestLeft
	err = c.Busy(ctx, r.ledger, func() error {
		defer s.Pin()()                                      // the partner's deadline does not cut the move short
		copied := s.AllowCopy(max(old.Size, old.ListedSize)) // a RENAME that copies answers late
		defer copied()
		if err := fault.Check("takeover:moving"); err != nil {
			return err // (a test holds the move here, as a slow copy would)
		}
		var err error
		left, err = sitefile.MoveClaimed(s, old.ClaimedPath, dst, in.ManifestName)
		return err
	})
	if ferr := fault.Check("takeover:moved"); ferr != nil && err == nil {
		return false, ferr
	}
	if left != nil {
		// the file's download holds it (manifest_invalid) unless the
		// manifest is beside it by then: the next run moves it there
		// while the row is live (rowOrphanClaims)
		add(ledger.Finding{Kind: ledger.KindTakeoverBlocked, IntakeID: in.ID, Path: left.Path, NeedsHuman: true, Action: "none",
			Detail: fmt.Sprintf("taken over into processing/%s/ without its manifest (%s); the next run moves the manifest beside the file while its row is live", r.worker, pgerr.Redact(left))})
	}
	switch {
	case errors.Is(err, sitefile.ErrNotMoved):
		// The row says dst, the file (with its manifest) is still at
		// the old path: the row is pointed back at it (under the new
		// token), so the new owner runs the file where it is, and no
		// orphan of it is left for a sweep to adopt as a second intake.
		// Its failure fails the section: the takeover is rolled back
		// with it, and the row names the file where it is.
		if rerr := c.RestorePath(ctx, in, old.ClaimedPath); rerr != nil {
			return false, rerr
		}
		f.Action += "; the file stays at its path (" + pgerr.Redact(err) + ")"
		add(f)
		return true, nil
	case err != nil:
		f.Detail = "the file is not in processing/ any more: " + pgerr.Redact(err)
		add(ledger.Finding{Kind: ledger.KindRemoteMissing, IntakeID: in.ID, Path: old.ClaimedPath,
			Action: "the worker continues from the spool where it can", Detail: pgerr.Redact(err)})
	}
	add(f)
	return true, nil
}

// Row 9: a commit whose outcome was unknown. The chunk ledger, written in
// the same transaction as the rows, says which chunks are in; the file goes
// back to applying and resumes after them. Nothing is retried blindly.
func (r *Reconciler) rowOutcomeUnknown(ctx context.Context, p *partners.Config, add addFunc) error {
	rows, err := r.ledger.Unknown(ctx, p.ID)
	if err != nil {
		return err
	}
	for _, in := range rows {
		chunks, err := r.ledger.ResolveUnknown(ctx, in)
		var fe *ledger.FencedError
		if errors.As(err, &fe) {
			add(ledger.Finding{Kind: ledger.KindOutcomeUnknown, IntakeID: in.ID, NeedsHuman: true, Action: "none",
				Detail: "ledger and progress disagree or the row moved: " + pgerr.Redact(err)})
			continue
		}
		if err != nil {
			return err
		}
		action := fmt.Sprintf("ledger holds %d committed chunks; back to applying, resumes at chunk %d", chunks, chunks)
		if in.Reason == reason.RetriesExhausted {
			action = fmt.Sprintf("ledger holds %d committed chunks; back to applying past its retry budget: its next run fails it for good (retries_exhausted)", chunks)
		}
		add(ledger.Finding{Kind: ledger.KindOutcomeUnknown, IntakeID: in.ID, Action: action})
		r.takenOver(p.ID)
	}
	return nil
}

// Row 4: spool temp files of downloads that died. Live downloads keep
// their temp file's mtime fresh; a worker also clears its own on start.
func (r *Reconciler) rowStaleSpoolTemp(p *partners.Config, add addFunc) error {
	if r.spool == nil {
		return nil
	}
	tmps, err := r.spool.TempFiles(p.ID, r.cfg.StaleTemp)
	if err != nil {
		return err
	}
	for _, t := range tmps {
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		add(ledger.Finding{Kind: ledger.KindStaleSpoolTemp, Path: t, Action: "deleted"})
	}
	return nil
}

// archiveName is <batch>.<sha12>.<intake_id>[.n]<ext>[.complete].
var archiveName = regexp.MustCompile(`\.[0-9a-f]{12}\.([0-9]+)(\.[0-9]+)?(\.[^.]*)?(\.complete)?$`)

// Row 13: a file in archive/ that no finished row accounts for: someone
// moved files by hand. Raised for a human (entries.go says for which
// states of the row it names); nothing is changed.
func (r *Reconciler) rowArchiveWithoutRecord(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	now := time.Now().UTC()
	var stale []staleEntry
	rows := r.lookup(ctx, p.ID, func(full string, id int64, in *ledger.Intake) {
		switch {
		case in == nil:
			add(ledger.Finding{Kind: ledger.KindArchiveNoRecord, Path: full, NeedsHuman: true, Action: "none",
				Detail: fmt.Sprintf("no intake %d of this partner", id)})
		case !archiveEntries.expected(in, full):
			stale = append(stale, staleEntry{path: full, in: in})
		}
	})
	for m := 0; m < r.cfg.ArchiveMonths; m++ {
		dir := s.Layout.ArchiveDir(now.AddDate(0, -m, 0))
		// streamed: a month of a busy partner's archive is not held
		err := s.ListDir(ctx, dir, func(f os.FileInfo) error {
			if strings.HasPrefix(f.Name(), ".") {
				return nil
			}
			full := path.Join(dir, f.Name())
			match := archiveName.FindStringSubmatch(f.Name())
			if match == nil {
				add(ledger.Finding{Kind: ledger.KindArchiveNoRecord, Path: full, NeedsHuman: true, Action: "none",
					Detail: "the name is not one intake writes"})
				return nil
			}
			id, _ := strconv.ParseInt(match[1], 10, 64)
			return rows.add(full, id)
		})
		err = rows.flushAfter(err)
		if sftpconn.IsNotExist(err) {
			continue
		}
		if err != nil {
			return err
		}
	}
	return r.raiseStale(ctx, p, s, ledger.KindArchiveNoRecord, archiveEntries, stale, add)
}

// lookupBatch is how many entries of a streamed listing one query looks
// up the rows of (rowLookup).
var lookupBatch = 500

// rowLookup looks up the rows that the entries of a streamed listing name
// by id, lookupBatch entries to a query, and judges each entry with its
// row (nil: none of the partner): a busy partner's archive month holds
// tens of thousands of entries, a query each.
type rowLookup struct {
	get   func(ids []int64) (map[int64]*ledger.Intake, error)
	judge func(full string, id int64, in *ledger.Intake)
	paths []string
	ids   []int64
}

func (r *Reconciler) lookup(ctx context.Context, partner string, judge func(full string, id int64, in *ledger.Intake)) *rowLookup {
	return &rowLookup{judge: judge, get: func(ids []int64) (map[int64]*ledger.Intake, error) {
		return r.ledger.GetMany(ctx, partner, ids)
	}}
}

// add queues an entry; its batch is looked up once full.
func (l *rowLookup) add(full string, id int64) error {
	l.paths, l.ids = append(l.paths, full), append(l.ids, id)
	if len(l.ids) >= lookupBatch {
		return l.flush()
	}
	return nil
}

// flushAfter flushes what a listing that ended with err queued: what it
// streamed before it ended is judged whatever the end (a directory that
// went away meanwhile goes on to the next). It returns err, or flush's
// error when the listing's was none or that the directory is gone.
func (l *rowLookup) flushAfter(err error) error {
	if ferr := l.flush(); ferr != nil && (err == nil || sftpconn.IsNotExist(err)) {
		return ferr
	}
	return err
}

// flush looks up and judges the entries queued.
func (l *rowLookup) flush() error {
	if len(l.ids) == 0 {
		return nil
	}
	rows, err := l.get(l.ids)
	if err != nil {
		return err
	}
	for i, full := range l.paths {
		l.judge(full, l.ids[i], rows[l.ids[i]])
	}
	l.paths, l.ids = l.paths[:0], l.ids[:0]
	return nil
}

// quarantineName is <intake_id>.<name>[.complete][.reason.json].
var quarantineName = regexp.MustCompile(`^([0-9]+)\.`)

// Row 13, for quarantine/: a held file or reason file that no row
// accounts for (entries.go says for which states of the row it names).
func (r *Reconciler) rowQuarantineWithoutRecord(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	dir := s.Layout.QuarantineDir()
	var stale []staleEntry
	judge := func(full string, _ int64, in *ledger.Intake) {
		switch {
		case in == nil:
			add(ledger.Finding{Kind: ledger.KindQuarantineNoRecord, Path: full, NeedsHuman: true, Action: "none",
				Detail: "no intake of this partner accounts for it"})
		case !quarantineEntries.expected(in, full):
			stale = append(stale, staleEntry{path: full, in: in})
		}
	}
	rows := r.lookup(ctx, p.ID, judge)
	err := s.ListDir(ctx, dir, func(f os.FileInfo) error { // streamed
		if strings.HasPrefix(f.Name(), ".") {
			return nil
		}
		full := path.Join(dir, f.Name())
		m := quarantineName.FindStringSubmatch(f.Name())
		if m == nil {
			judge(full, 0, nil)
			return nil
		}
		id, _ := strconv.ParseInt(m[1], 10, 64)
		return rows.add(full, id)
	})
	err = rows.flushAfter(err)
	if sftpconn.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return r.raiseStale(ctx, p, s, ledger.KindQuarantineNoRecord, quarantineEntries, stale, add)
}

// Row 14: an upload abandoned in incoming/: the partner's contract owner
// should know.
func (r *Reconciler) rowStaleUploads(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc) error {
	// streamed: incoming/ is the partner's to fill
	err := s.ListDir(ctx, s.Layout.IncomingDir(), func(e os.FileInfo) error {
		if strings.HasSuffix(e.Name(), ".part") && time.Since(e.ModTime()) > p.Limits.StaleUpload {
			add(ledger.Finding{Kind: ledger.KindStaleUpload, Path: path.Join(s.Layout.IncomingDir(), e.Name()), NeedsHuman: true,
				Action: "none", Detail: fmt.Sprintf("upload untouched for %s (limit %s)", time.Since(e.ModTime()).Round(time.Minute), p.Limits.StaleUpload)})
		}
		return nil
	})
	if sftpconn.IsNotExist(err) {
		return nil
	}
	return err
}

// Row 15, what is left over: pollers move symlinks and other non-regular
// entries, unsafe names and names no feed matches to quarantine/ at once;
// one still in ready/ after 10 minutes means that failed (permissions, no
// daemon). Manifest-mode data files whose manifest is long overdue too.
//
// ready/ is streamed (sftpconn.Session.ListDir), judged by the poller's
// rules (partners/ready.go), and only what may be reported is kept: the
// entries to report, and in manifest mode the overdue data files whose
// manifest the listing has not passed yet (a file and its manifest come
// in either order) with the manifests it passed (bounded,
// partners.Manifests).
//
// Only the oldest maxFindingsPerKind entries to report are kept while
// the listing runs (the rest counted: more); a ready/ of millions of
// such entries costs the run a count.
func (r *Reconciler) rowUnclaimableReady(ctx context.Context, p *partners.Config, s *sftpconn.Session, add addFunc,
	more func(kind string, n int, needsHuman bool)) error {
	found := &oldestEntries{max: maxFindingsPerKind}
	waiting := map[string]os.FileInfo{} // overdue data files, by name, until their manifest shows
	var manifests partners.Manifests
	err := s.ListDir(ctx, s.Layout.ReadyDir(), func(e os.FileInfo) error {
		_, why := partners.ClassifyEntry(p, e)
		switch why {
		case reason.Dotfile, reason.PartialUpload:
		case reason.IgnoredName:
			// readiness stable: an upload tool's temporary name, abandoned
			// once untouched for stale_upload (as row 14 in incoming/)
			if age := time.Since(e.ModTime()); age > p.Limits.StaleUpload {
				add(ledger.Finding{Kind: ledger.KindStaleUpload, Path: path.Join(s.Layout.ReadyDir(), e.Name()), NeedsHuman: true, Action: "none",
					Detail: fmt.Sprintf("upload under a temporary name untouched for %s (limit %s)", age.Round(time.Minute), p.Limits.StaleUpload)})
			}
		case reason.ManifestFile:
			manifests.Add(e.Name())
			delete(waiting, strings.TrimSuffix(e.Name(), partners.ManifestSuffix))
		case "":
			overdue := time.Since(e.ModTime()) >= p.Limits.StaleUpload
			if p.Readiness == partners.ReadinessManifest && overdue && !manifests.Seen(e.Name()+partners.ManifestSuffix) {
				waiting[e.Name()] = e
			}
		default:
			if p.Records() {
				break // claim: record: a hostile entry is held as a record and stays; open quarantine says so
			}
			if time.Since(e.ModTime()) >= unclaimableAfter {
				found.push(partners.Skipped{Info: e, Reason: why})
			}
		}
		return nil
	})
	if err != nil {
		return err // names the directory
	}
	for name, e := range waiting {
		if !manifests.Has(name+partners.ManifestSuffix, s.RegularInReady) {
			found.push(partners.Skipped{Info: e, Reason: reason.ManifestMissing})
		}
	}
	for _, sk := range found.sorted() {
		// the name as listed, unsafe ones too (never "." or "..", never
		// with a "/": the listing leaves such names out); the commands
		// print it escaped (internal/inert)
		add(ledger.Finding{Kind: ledger.KindUnclaimableReady, Path: s.Layout.ReadyDir() + "/" + sk.Info.Name(), NeedsHuman: true,
			Action: "none", Detail: "not claimed: " + string(sk.Reason)})
	}
	if found.dropped > 0 {
		more(ledger.KindUnclaimableReady, found.dropped, true)
	}
	return nil
}

// oldestEntries keeps the max oldest entries pushed (oldest first, as the
// poller claims; by name among the same time) and counts the others.
type oldestEntries struct {
	max     int
	h       skippedHeap // the newest kept on top
	dropped int
}

func (o *oldestEntries) push(sk partners.Skipped) {
	if len(o.h) < o.max {
		heap.Push(&o.h, sk)
		return
	}
	o.dropped++
	if older(sk, o.h[0]) {
		o.h[0] = sk
		heap.Fix(&o.h, 0)
	}
}

// sorted is the entries kept, oldest first.
func (o *oldestEntries) sorted() []partners.Skipped {
	out := slices.Clone(o.h)
	slices.SortFunc(out, func(a, b partners.Skipped) int {
		if older(a, b) {
			return -1
		}
		if older(b, a) {
			return 1
		}
		return 0
	})
	return out
}

// older orders entries as the poller claims them: by time, then name.
func older(a, b partners.Skipped) bool {
	if !a.Info.ModTime().Equal(b.Info.ModTime()) {
		return a.Info.ModTime().Before(b.Info.ModTime())
	}
	return a.Info.Name() < b.Info.Name()
}

// skippedHeap is a max-heap of entries by older: the newest on top.
type skippedHeap []partners.Skipped

func (h skippedHeap) Len() int           { return len(h) }
func (h skippedHeap) Less(i, j int) bool { return older(h[j], h[i]) }
func (h skippedHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *skippedHeap) Push(x any)        { *h = append(*h, x.(partners.Skipped)) }
func (h *skippedHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Rows 17 and 18: the site refuses its pinned host key, or cannot be
// reached. The daemon backs off this partner alone.
func (r *Reconciler) rowPartnerUnreachable(err error, add addFunc) {
	if sftpconn.IsHostKeyMismatch(err) {
		add(ledger.Finding{Kind: ledger.KindHostKeyMismatch, NeedsHuman: true, Action: "refused to connect", Detail: pgerr.Redact(err)})
		return
	}
	add(ledger.Finding{Kind: ledger.KindPartnerDown, NeedsHuman: true, Action: "none", Detail: pgerr.Redact(err)})
}

// Files held for an ops decision: quarantined, or failed for good.
func (r *Reconciler) openQuarantine(ctx context.Context, p *partners.Config, add addFunc) error {
	rows, err := r.ledger.OpenHeld(ctx, p.ID)
	if err != nil {
		return err
	}
	for _, in := range rows {
		add(ledger.Finding{Kind: ledger.KindQuarantined, IntakeID: in.ID, Path: in.ArchivePath, NeedsHuman: true,
			Action: "waits for ops", Detail: "reason " + string(in.Reason)})
	}
	return nil
}

func (r *Reconciler) takenOver(partner string) {
	if r.onTakeover != nil {
		r.onTakeover(partner)
	}
}
