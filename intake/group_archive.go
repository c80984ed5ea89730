package intake

import (
	"context"
	"errors"
	"path"
	"sync"
	"time"

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
	// FenceGroup. A group that got here later than a third of a lease
	// after it (a stall) checks again.
	if !g.committedAt.IsZero() && time.Since(g.committedAt) < g.d.ledger.Lease()/3 {
		for _, f := range done {
			f.r.groupFencedAt = g.committedAt
		}
	} else {
		start := time.Now()
		ids := make([]*Intake, len(done))
		for i, f := range done {
			ids[i] = f.r.in
		}
		if held, err := g.d.ledger.FenceGroup(ctx, ids); err == nil {
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
			errs[i] = g.archiveOne(ctx, f)
		}()
	}
	wg.Wait()
	for _, f := range done {
		f.r.groupFencedAt = time.Time{} // the burst is over: the file's later steps check alone
	}
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
	moved, err := g.d.ledger.ArchiveGroup(ctx, ins)
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

// archiveOne is archiveRemote for a file of the group: the file moved to
// archive/ and its receipt published. When the receipt's temporary file
// was opened ahead (fetch), the receipt's bytes are written into it
// beside the move, naming the archive name the move takes unless this
// very step ran before (the first candidate: it carries the intake id);
// then the temporary file is closed and renamed to the receipt's name,
// under the same fence as putFile's. The receipt appears by one rename of
// a complete, closed file, as putFile's does. Anything else — the move
// took another name, the file is gone, a write failed — discards the
// temporary file and goes archiveRemote's way, which finds the move
// already made (moveOnce is idempotent) and writes the receipt anew.
func (g *fileGroup) archiveOne(ctx context.Context, f *groupFile) error {
	r, st := f.r, f.rcpt
	if st == nil || r.in.ReplayOf != 0 || r.in.ManifestName != "" || r.in.Override != "" {
		_, _, err := r.archiveRemote(ctx, OutcomeAccepted, 0)
		return err
	}
	f.rcpt = nil // published or discarded below
	in := r.in
	if err := r.fence(ctx, "archive"); err != nil {
		st.discard()
		return err
	}
	names := archiveNames(r.sess.Layout.ArchiveDir(in.ClaimedAt), in, 9)
	data, err := receiptJSON(in, Receipt{Outcome: OutcomeAccepted, Archive: names[0]})
	if err != nil {
		st.discard()
		return err
	}
	data, name, err := sealReport(r.feedPGP(), data, reportStem(in)+ReceiptSuffix)
	if err != nil {
		st.discard()
		return err
	}
	var werr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = st.write(data) // discards the temporary file when it fails
	}()
	dst, merr := moveOnce(r.sess, in.ClaimedPath, names)
	wg.Wait()
	if merr != nil || dst != names[0] || werr != nil {
		if werr == nil {
			st.discard()
		}
		_, _, err := r.archiveRemote(ctx, OutcomeAccepted, 0)
		return err
	}
	in.ArchivePath = dst
	if err := fault.Check("archive:mid"); err != nil {
		st.discard()
		return err
	}
	if err := r.fence(ctx, "receipt"); err != nil {
		st.discard()
		return err
	}
	p, err := st.publish(path.Join(r.sess.Layout.ReportsDir(), name))
	if err != nil {
		return err
	}
	in.ReceiptPath = p
	return nil
}
