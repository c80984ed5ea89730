package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
)

// Replay applies the spooled bytes of a finished file again (after a
// mapping or target fix, say) as a new intake of the same batch, audited.
// It is idempotent by construction: rows whose values do not change are
// counted unchanged, and the replay writes as the intake that brought the
// bytes it applies (the file replayed; for a duplicate, the earlier intake
// of its batch and bytes; for a replay, what that replay wrote as), so rows
// a later intake wrote are held back as conflicts, never overwritten. The
// replay's receipt goes to the partner's reports/; its bytes stay archived
// under the original. progress, if set, is called after each committed
// chunk. A snapshot older than one its feed has applied since is refused
// (snapshot.go): replayed, it would take the table back to an older set;
// forceOlder replays it all the same, audited as such.
func (d *Daemon) Replay(ctx context.Context, id int64, actor, reason string, forceOlder bool, progress func(done, total int64)) (*Intake, error) {
	if actor == "" || reason == "" {
		return nil, fmt.Errorf("%w: an actor and a reason are required", ErrDecision)
	}
	var orig *Intake
	for _, pid := range d.order {
		got, err := d.ledger.Get(ctx, pid, id)
		if err != nil {
			return nil, err
		}
		if got != nil {
			orig = got
		}
	}
	if orig == nil {
		return nil, fmt.Errorf("%w: no intake %d of a configured partner", ErrDecision, id)
	}
	if orig.State != StateArchived && orig.State != StateDuplicate {
		return nil, fmt.Errorf("%w: intake %d is %s; only finished files are replayed", ErrDecision, id, orig.State)
	}
	// a compressed file's expanded copy is made again from the original
	// (dropExpanded removed it when the file finished)
	if !d.spool.Has(orig.Partner, orig.DataSHA256, orig.DataSize) && !d.spool.Has(orig.Partner, orig.SHA256, orig.Size) {
		return nil, fmt.Errorf("%w: the spool no longer holds the bytes of intake %d", ErrDecision, id)
	}
	p := d.parts[orig.Partner]
	// root is the intake the replay writes as, the one that brought the
	// bytes it applies: rows any later intake wrote are then conflicts of
	// the replay (merge's newer-than guard), never set back
	root := orig.ID
	switch {
	case orig.ReplayOf != 0: // a replay of a replay is judged as the first
		root = orig.ReplayOf
	case orig.State == StateDuplicate: // its bytes came with an earlier intake
		brought, err := d.ledger.BroughtBy(ctx, orig)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		if brought == 0 {
			return nil, fmt.Errorf("%w: no intake before duplicate %d brought its bytes of batch %s", ErrDecision, id, orig.BatchID)
		}
		root = brought
	}
	override := ""
	if feed := p.cfg.Feed(orig.Feed); feed != nil && feed.Mode == partners.ModeSnapshot {
		newer, err := ledger.SupersededBy(ctx, d.db, orig.Partner, orig.Feed, root, false)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		switch {
		case newer != 0 && !forceOlder:
			return nil, fmt.Errorf("%w: intake %d is a snapshot older than intake %d, which its feed has applied since: replayed, it would undo the newer one (--force-older replays it all the same, audited)", ErrDecision, id, newer)
		case newer != 0:
			override = OverrideOlder
		}
	}
	in, err := d.ledger.InsertReplay(ctx, orig, fmt.Sprintf("replay:%d:%d", id, time.Now().UnixNano()),
		OpsWorker(d.cfg.WorkerID), root, override, actor, reason)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	sess, err := partners.Dial(ctx, p.cfg)
	if err != nil {
		return in, err
	}
	defer sess.Close()
	r, err := d.newRun(p, sess, in)
	if err != nil {
		return in, err
	}
	r.progress = progress
	if err := r.run(ctx); err != nil {
		var fe *FencedError
		if errors.As(err, &fe) {
			return in, fmt.Errorf("replay intake %d was taken over: %w", in.ID, err)
		}
		return in, err
	}
	return in, nil
}
