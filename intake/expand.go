package intake

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/unwrap"
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
	job := unwrap.Job{Spool: r.d.spool, Partner: r.in.Partner, Feed: r.feed, Name: r.in.RemoteName,
		MaxBytes: r.p.cfg.Limits.MaxExpandedBytes, MaxRatio: r.p.cfg.Limits.MaxExpansionRatio, MinFree: r.d.cfg.SpoolMinFree,
		DropPlain: r.dropPlain}
	if follow {
		job.Follow, job.Landed = r.followRows(ctx)
	}
	return job.Run(orig)
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
// missing after dropExpanded) and checks it is the same bytes.
func (r *fetchStage) reexpand() (bool, error) {
	in := r.in
	if in.DataSHA256 == in.SHA256 || !r.d.spool.Has(in.Partner, in.SHA256, in.Size) {
		return false, nil
	}
	data, held, err := r.expand(context.Background(), spool.Entry{Partner: in.Partner, SHA256: in.SHA256, Size: in.Size}, false)
	if err != nil || held != nil {
		return false, fmt.Errorf("expand again: %v %v", err, held)
	}
	if data.SHA256 != in.DataSHA256 {
		return false, fmt.Errorf("expanded bytes differ from the first expansion")
	}
	return true, nil
}
