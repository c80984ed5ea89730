package intake

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// ErrRemoteLost: the claimed file is gone from processing/ and no earlier
// move of it can be found (moved or deleted by hand). Matrix row 12.
var ErrRemoteLost = errors.New("the claimed remote file is gone")

// moveOnce renames src to the first free name from candidates, never
// overwriting (SFTP RENAME fails when the target exists; candidate names
// carry the intake id, so the first is free unless this very step ran
// before). The common case costs one request; only a refused rename asks
// more. When src is already gone and a candidate exists, an earlier
// attempt moved it: that candidate is returned, so a resumed step is
// idempotent.
func moveOnce(s *sftpconn.Session, src string, candidates []string) (string, error) {
	if err := s.EnsureDir(path.Dir(candidates[0])); err != nil {
		return "", fmt.Errorf("create %s: %w", path.Dir(candidates[0]), err)
	}
	if err := s.Rename(src, candidates[0]); err == nil {
		return candidates[0], nil
	}
	if _, err := s.Lstat(src); sftpconn.IsNotExist(err) {
		for i := len(candidates) - 1; i >= 0; i-- {
			if _, err := s.Lstat(candidates[i]); err == nil {
				return candidates[i], nil
			}
		}
		return "", fmt.Errorf("move %s: %w", src, ErrRemoteLost)
	} else if err != nil {
		return "", fmt.Errorf("stat %s: %w", src, err)
	}
	var last error
	for _, dst := range candidates {
		if _, err := s.Lstat(dst); err == nil {
			continue // taken: never overwrite
		}
		if last = s.Rename(src, dst); last == nil {
			return dst, nil
		}
	}
	return "", fmt.Errorf("move %s: no free target name: %w", src, last)
}

// claimedIsOurs reports whether the entry at the file's claimed path is
// this intake's file, before archive or a hold moves it: a run that did
// not put the file there or read it there itself (a resume from the
// spool, a takeover) may find another file under the name, claimed to the
// path after this intake's own file left it. Its size (the bytes spooled,
// else those listed at the claim) and its mtime (when the claim recorded
// one), which a RENAME keeps, must be this intake's; the hash is not read
// again. A path holding something else is left alone: the run goes on as
// when its file is gone (the spool keeps its bytes), and the partner's
// next poll adopts the entry as a claim of its own once this intake ends.
// A hostile entry is held whatever it is (a directory, a symlink), never
// read: its path's generated name (partners.HostilePrefix) is no other
// entry's.
func (r *fileRun) claimedIsOurs() (bool, error) {
	if r.placed || r.in.ReplayOf != 0 || r.p.cfg.Records() || r.in.Feed == ledger.NoFeed {
		return true, nil
	}
	st, err := r.sess.Lstat(r.in.ClaimedPath)
	if sftpconn.IsNotExist(err) {
		return true, nil // the move finds it gone
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", r.in.ClaimedPath, err)
	}
	size := r.in.Size
	if size == 0 {
		size = r.in.ListedSize
	}
	// the listing's mtime, unless the server's RENAME stamps its own (a
	// copy): the claim's RENAME then changed it
	sameTime := r.in.ListedMTime.IsZero() || r.p.restamps.Load() || st.ModTime().Equal(r.in.ListedMTime)
	if st.Mode().IsRegular() && st.Size() == size && sameTime {
		r.placed = true
		return true, nil
	}
	r.log.Warn("the file at this intake's claimed path is not its file (size or mtime differ); left there for a claim of its own",
		"reason", reason.RemoteLost)
	r.p.takenOver.Store(true)
	return false, nil
}

// fence checks, right before a step the partner can see (a move, a reason
// file, a receipt), that this run still holds the file's fencing token, and
// renews the lease with the same conditional statement: no takeover can
// happen for one lease from here, so a stalled owner that wakes after a
// takeover publishes nothing.
//
// A file of a group is checked with its group, in one statement shortly
// before the group's steps on the site go out together: the group's
// transaction to applied, which matches every file's token and renews its
// lease, or Renew when that is older than a third of a lease
// (group_archive.go); that check stands for the file's own steps of that
// burst while it is less than a third of a lease old. One commit per step cost
// a group of 32 small files 64 commits before its receipts (the warm
// small-file rate fell from about 1300 to about 500 files/s,
// docs/performance.md); the per-file path still checks before every step.
func (r *fileRun) fence(ctx context.Context, step string) error {
	if err := fault.Check("publish:" + step); err != nil {
		return err
	}
	// A run of this process's worker id publishes only under the hold of
	// the id it began in (workerid.go): a process that lost the id, even
	// if it took it again, may have had its files taken over at once by
	// another process of the id meanwhile. (An ops command's rows are its
	// own identity's, OpsWorker.)
	own := r.in.Worker == r.d.cfg.WorkerID
	id := r.d.workerID.Lock()
	lost := func() bool { return own && !id.HeldIn(r.idHold) }
	notHeld := func() error {
		return &ledger.FencedError{IntakeID: r.in.ID, Token: r.in.Token, Step: step + ": " + errWorkerIDNotHeld.Error()}
	}
	if lost() {
		return notHeld()
	}
	switch {
	case own && id.Pooled().PID != 0:
		// a one-shot run's hold is not watched: each fence asks whether
		// its connection still holds the lock (no group window)
		err := r.d.ledger.Heartbeat(ctx, r.in, &ledger.HeldBy{Worker: r.d.cfg.WorkerID, At: id.Pooled()})
		var fe *ledger.FencedError
		if errors.As(err, &fe) {
			// The lock's connection may have ended under the file (the
			// pool closes a connection whose statement was cancelled, an
			// apply ahead abandoned): the lock is taken again on another
			// when no other process holds the id, and the fence asked once
			// more. The file's token still fences a takeover made while
			// the id was free.
			if cerr := id.CheckPooled(ctx); cerr != nil {
				return err
			}
			err = r.d.ledger.Heartbeat(ctx, r.in, &ledger.HeldBy{Worker: r.d.cfg.WorkerID, At: id.Pooled()})
		}
		if err != nil {
			return err
		}
	case r.groupFencedAt.IsZero() || time.Since(r.groupFencedAt) >= r.d.ledger.Lease()/3:
		if err := r.d.ledger.Heartbeat(ctx, r.in, nil); err != nil {
			return err
		}
	}
	if lost() {
		return notHeld()
	}
	return nil
}
