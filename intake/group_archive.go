package intake

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
)

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
	// the handles fetch read are closed before their files move (the
	// replies came in while the group committed)
	g.closing.Wait()
	// One check for the group right before its files' steps on the site
	// go out together (fence). The transaction that just moved every one
	// of them to applied was that check: it matched each file's fencing
	// token and renewed its lease from its start (ledger.AppliedGroup),
	// so no takeover can happen for a lease from committedAt, as from a
	// renewal (Ledger.Renew). A group that got here later than a third of a lease
	// after it (a stall) checks again.
	if !g.committedAt.IsZero() && time.Since(g.committedAt) < g.d.ledger.Lease()/3 {
		for _, f := range done {
			f.r.groupFencedAt = g.committedAt
		}
	} else {
		start := time.Now()
		ids := make([]*ledger.Intake, len(done))
		for i, f := range done {
			ids[i] = f.r.in
		}
		if held, err := g.d.ledger.Renew(ctx, ids, nil); err == nil {
			for _, f := range done {
				if held[f.r.in.ID] {
					f.r.groupFencedAt = start
				}
			}
		}
	}
	errs := make([]error, len(done))
	var wg sync.WaitGroup
	for i, f := range done {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = f.r.finishStage().archiveRemote(ctx, ledger.OutcomeAccepted, 0) // the receipt opened beside the read (moveBesideReceipt)
		}()
	}
	wg.Wait()
	for _, f := range done {
		f.r.groupFencedAt = time.Time{} // the burst is over: the file's later steps check alone
	}
	var ins []*ledger.Intake
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
	moved, err := g.d.ledger.FinishArchived(ctx, ins, ledger.StateApplied, ledger.StateArchived, "")
	if err != nil {
		return err
	}
	for _, f := range ok {
		if !moved[f.r.in.ID] {
			f.r.fencedOut("finish as archived (group)")
			continue
		}
		f.r.in.State = ledger.StateArchived
		f.r.finishStage().archived(ledger.OutcomeAccepted, ledger.StateArchived)
	}
	return nil
}
