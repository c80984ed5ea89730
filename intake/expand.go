package intake

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/unwrap"
	"github.com/partner-intake/partner-intake/internal/reason"
	"github.com/partner-intake/partner-intake/spool"
)

// expand returns the bytes rows come from (intake/unwrap): the file's
// bytes expanded or decrypted into the spool, bounded while they stream,
// or what the file is held for; a file that is not compressed is its own
// data. follow: its rows are read as the unwrapped bytes land
// (followRows), as a plain file's are while it downloads: the plan's scan
// in that pass, and a large file applied ahead of its plan, which a
// signature found wrong at the end rolls back with the hold.
func (r *fetchStage) expand(ctx context.Context, orig spool.Entry, follow bool) (spool.Entry, *unwrap.Held, error) {
	return r.unwrapJob(ctx, follow).Run(orig)
}

// unwrapJob is the file's unwrapping (expand), its rows followed as they
// land when follow says so.
func (r *fetchStage) unwrapJob(ctx context.Context, follow bool) unwrap.Job {
	job := unwrap.Job{Spool: r.d.spool, Partner: r.in.Partner, Feed: r.feed, Name: r.in.RemoteName,
		MaxBytes: r.p.cfg.Limits.MaxExpandedBytes, MaxRatio: r.p.cfg.Limits.MaxExpansionRatio, MinFree: r.d.cfg.SpoolMinFree,
		DropPlain: r.dropPlain}
	if follow {
		job.Follow, job.Landed = r.followRows(ctx)
	}
	return job
}

// unwrapping is a file's unwrapping that follows its download (fetch,
// for a job that unwrap.Job.Streams): it reads the original's bytes as
// they land in the spool, so an OpenPGP file is decrypted, and its rows
// read and applied ahead, while it downloads rather than after.
type unwrapping struct {
	fl   *spool.Follower
	done chan unwrapped
	// stop ends what follows the unwrapped bytes (the apply ahead, which
	// an unkept plaintext's decryption waits on, wherever it waits)
	stop context.CancelFunc
}

// unwrapped is what an unwrapping made of the file (expand's results).
type unwrapped struct {
	data spool.Entry
	held *unwrap.Held
	err  error
}

// followUnwrap is the spool option that starts the file's unwrapping on
// a follower of its download, or nil for a file whose unwrapping does not
// stream or that is listed smaller than a file applied ahead of its plan
// (aheadBytes): a small one ends in a moment, and is unwrapped after its
// download. A large one's rows go to PostgreSQL from its first bytes,
// near site or far: decrypted after its download, the 1 GB file's COPY,
// the longest part of its run, starts 5 s late on loopback
// (docs/performance.md).
func (r *fetchStage) followUnwrap(ctx context.Context, follow bool) (spool.PutOption, *unwrapping) {
	job := unwrap.Job{Feed: r.feed, Name: r.in.RemoteName}
	if !job.Streams() || r.in.ListedSize < aheadBytes {
		return nil, nil
	}
	u := &unwrapping{done: make(chan unwrapped, 1)}
	ctx, u.stop = context.WithCancel(ctx)
	return spool.Follow(func(fl *spool.Follower) {
		u.fl = fl
		go func() {
			var res unwrapped
			job := r.unwrapJob(ctx, follow)
			// the plaintext of a file applied ahead is read once, by the
			// apply ahead as it is decrypted, and not written to the
			// spool (a step that reads it there after all has it
			// decrypted again: ensureSpooled); so the apply ahead's slot
			// is taken first, and given back if the decryption ends
			// before the apply ahead starts
			if follow && r.aheadWanted() && r.takeAheadSlot() {
				job.Unkept, r.aheadSlot = true, true
			}
			res.data, res.held, res.err = job.RunOn(fl)
			if r.aheadSlot {
				r.aheadSlot = false
				<-r.d.ahead
			}
			fl.Close() // its descriptor of the spooled download
			u.done <- res
		}()
	}), u
}

// wait is the unwrapping's result once the download it follows is whole.
func (u *unwrapping) wait() (spool.Entry, *unwrap.Held, error) {
	res := <-u.done
	return res.data, res.held, res.err
}

// drop stops an unwrapping whose download is not the file's (a failed or
// refetched attempt, a file held before its bytes are used) and undoes
// what it made: the rows it had followed, applied ahead or not, and its
// plaintext in the spool.
func (u *unwrapping) drop(r *fetchStage) {
	u.stop()
	u.fl.Close()
	res := <-u.done
	r.dropAhead()
	r.dropPre()
	if res.err == nil && res.held == nil {
		r.dropPlain(res.data)
	}
}

// dropExpanded deletes a compressed file's expanded copy from the spool
// once the file is finished (archived, duplicate, quarantined, failed):
// the original is what the spool keeps (retention), and the expanded
// bytes, up to limits.max_expanded_bytes per file, are made again from it
// when they are needed (a replay, a released file: ensureSpooled). A copy
// that an unfinished intake of the partner also reads (the same expanded
// bytes) is kept for it. A failure is logged only: purge removes the copy
// at retention anyway.
func (r *fileRun) dropExpanded(ctx context.Context) {
	in := r.in
	if in.DataSHA256 == "" || in.DataSHA256 == in.SHA256 || !finished(in.State) {
		return
	}
	busy, err := r.d.ledger.DataInUse(ctx, in)
	if err == nil && !busy {
		err = r.d.spool.Remove(in.Partner, in.DataSHA256)
	}
	if err != nil {
		r.log.Warn("expanded copy not removed from the spool; purge removes it at retention", "err", err)
	}
}

// finished: the file's bytes are not read again unless ops act on it.
func finished(s ledger.State) bool {
	switch s {
	case ledger.StateArchived, ledger.StateDuplicate, ledger.StateQuarantined, ledger.StateFailedTerminal, ledger.StateDiscarded, ledger.StatePutBack:
		return true
	}
	return false
}

// reexpand makes the expanded copy again from the spooled original (it is
// missing after dropExpanded): true when it did (or held the file), false
// when the original is not in the spool either.
func (r *fetchStage) reexpand(ctx context.Context) (bool, error) {
	in := r.in
	if in.DataSHA256 == in.SHA256 || !r.d.spool.Has(in.Partner, in.SHA256, in.Size) {
		return false, nil
	}
	return true, r.expandAgain(ctx, spool.Entry{Partner: in.Partner, SHA256: in.SHA256, Size: in.Size})
}

// expandAgain makes the file's expanded (or decrypted) copy again from
// orig, its original, and holds the file when that is not what its first
// expansion made: the feed in force refuses it now (a compression no
// longer allowed, a lower limit, a key gone), or the bytes differ. An
// error (the spool's disk) keeps its kind, so a transient one is retried
// and nothing else is.
func (r *fetchStage) expandAgain(ctx context.Context, orig spool.Entry) error {
	data, held, err := r.expand(ctx, orig, false)
	if err != nil {
		return fmt.Errorf("expand again: %w", err)
	}
	if held != nil {
		return r.hold(ctx, ledger.StateQuarantined, held.Reason, 0, "unwrapped again: "+held.Detail)
	}
	if data.SHA256 == orig.SHA256 {
		// the feed in force no longer unwraps the file (its pgp section
		// gone): its rows came from bytes it would no longer make, and
		// the original, which the spool keeps, is not one to drop
		return r.hold(ctx, ledger.StateQuarantined, reason.MappingChanged, 0, "unwrapped again: the feed no longer decrypts or expands the file its rows came from")
	}
	if data.SHA256 != r.in.DataSHA256 {
		r.dropPlain(data)
		return r.hold(ctx, ledger.StateQuarantined, reason.ArchiveInvalid, 0, "unwrapped again, its original gives other bytes than the first time")
	}
	return nil
}
