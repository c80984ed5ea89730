package reconcile

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// The rows that judge an entry on the site by the state of the row it
// names (row 13, for archive/ and quarantine/) name here, for every state
// of the ledger (ledger.States), whether an entry may be there. A test
// holds each table to the ledger's states and walks every state through
// both rows.

// expect is whether an entry of a row in some state may be where it was
// found.
type expect int

const (
	// stale: the entry has no business there; a human looks.
	stale expect = iota
	// evidence: the state's own file (a held file and its reason file in
	// quarantine/).
	evidence
	// atArchivePath: a finished file, at the row's archive path only.
	atArchivePath
	// owned: the row's owner is moving the file there or away right now
	// (holding it, archiving it, finishing a released file), or a
	// takeover resumes that when the owner's lease ends.
	owned
	// ifReleased: a released file keeps its reason file (and, until a
	// takeover moves it, its bytes) in quarantine/ until it is archived;
	// an unreleased row in this state has nothing there.
	ifReleased
)

// entries is one row's table: state -> expect.
type entries map[ledger.State]expect

// quarantineEntries: quarantine/<id>.<name>[.complete][.reason.json].
var quarantineEntries = entries{
	ledger.StateClaimed:          owned, // being held now, or released and not yet taken over
	ledger.StateSpooled:          owned,
	ledger.StateApplying:         owned, // held mid-apply (reject rate), or released and applying
	ledger.StateApplied:          owned, // released, committed, not yet archived
	ledger.StateOutcomeUnknown:   owned,
	ledger.StateAwaitingApproval: ifReleased,
	ledger.StateQuarantined:      evidence,
	ledger.StateFailedTerminal:   evidence,
	ledger.StateDiscarded:        evidence,
	ledger.StateArchived:         stale, // archiving removes a released file's reason file before the row says archived
	ledger.StateDuplicate:        stale,
	ledger.StatePutBack:          stale,
}

// archiveEntries: archive/YYYY/MM/<batch>.<sha12>.<id>[.n]<ext>[.complete].
var archiveEntries = entries{
	ledger.StateClaimed:          stale,
	ledger.StateSpooled:          stale,
	ledger.StateApplying:         stale,
	ledger.StateApplied:          owned, // committed and moved to archive/, the row not yet archived
	ledger.StateOutcomeUnknown:   stale,
	ledger.StateAwaitingApproval: stale,
	ledger.StateQuarantined:      stale,
	ledger.StateFailedTerminal:   stale,
	ledger.StateDiscarded:        stale,
	ledger.StateArchived:         atArchivePath,
	ledger.StateDuplicate:        atArchivePath,
	ledger.StatePutBack:          stale,
}

// expected says whether full, an entry naming in, may be there. A state
// the table does not know is stale: a human looks rather than a guess.
func (e entries) expected(in *ledger.Intake, full string) bool {
	switch e[in.State] {
	case evidence, owned:
		return true
	case atArchivePath:
		return full == in.ArchivePath || full == in.ArchivePath+partners.ManifestSuffix
	case ifReleased:
		return in.Override != ""
	}
	return false
}

// staleEntry is an entry a listing found that its row's state says has
// no business there.
type staleEntry struct {
	path string
	in   *ledger.Intake
}

// raiseStale raises each stale entry for a human once it is confirmed
// after the listing: the row is read again and the entry looked at again,
// in that order. A file's owner changes the site before its row (it
// removes a reason file, moves a file to archive/, then records the new
// state), so an entry still there after a state that does not expect it
// was read is stale in fact, not a step in flight.
func (r *Reconciler) raiseStale(ctx context.Context, p *partners.Config, s *sftpconn.Session, kind string, e entries, found []staleEntry, add addFunc) error {
	for _, f := range found {
		in, err := r.ledger.Get(ctx, p.ID, f.in.ID)
		if err != nil {
			return err
		}
		if in == nil || e.expected(in, f.path) {
			continue
		}
		if _, err := s.Lstat(f.path); err != nil {
			if sftpconn.IsNotExist(err) {
				continue // moved on meanwhile
			}
			return err
		}
		detail := fmt.Sprintf("intake %d is in state %s, which has nothing here", in.ID, in.State)
		if in.State == ledger.StateArchived || in.State == ledger.StateDuplicate {
			if e[in.State] == atArchivePath {
				detail = fmt.Sprintf("intake %d was archived under another name", in.ID)
			}
		}
		add(ledger.Finding{Kind: kind, IntakeID: in.ID, Path: f.path, NeedsHuman: true, Action: "none", Detail: detail})
	}
	return nil
}
