package sitefile

import (
	"context"
	"fmt"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// PublishDiscarded tells the partner that a held file was discarded: the
// reason file is removed and the receipt rewritten with outcome
// "discarded", then its path recorded. Each step is conditional on the
// token the discard took, so a later decision's publication is never
// overwritten by this one; run twice, it writes the same.
func PublishDiscarded(ctx context.Context, l *ledger.Ledger, s *sftpconn.Session, p *partners.Config, in *ledger.Intake) error {
	still := func() error { return l.StillDiscarded(ctx, in) }
	if in.ArchivePath != "" {
		if err := still(); err != nil {
			return err
		}
		// beside the held file, wherever the config in force puts
		// quarantine/ now
		if err := s.Remove(ReasonName(in.ArchivePath)); err != nil && !sftpconn.IsNotExist(err) {
			return fmt.Errorf("remove reason file: %w", err)
		}
	}
	q := in.ArchivePath
	if in.ReplayOf != 0 {
		q = "" // a replay has no file of its own in quarantine/
	}
	data, err := ReceiptJSON(in, Receipt{Outcome: ledger.OutcomeDiscarded, Reason: in.Reason, Quarantine: q, Detail: discardDetail(in)})
	if err != nil {
		return err
	}
	// sealed to the partner's key like the held file's receipt it replaces
	data, name, err := Seal(PGPOf(p, in.Feed), data, ReportStem(in)+ReceiptSuffix)
	if err != nil {
		return err
	}
	if err := still(); err != nil {
		return err
	}
	dst, err := Put(s, s.Layout.ReportsDir(), name, data)
	if err != nil {
		return err
	}
	// the held file's receipt under another name (held before its batch
	// id was known, or sealed otherwise then) or in another reports dir
	// (the one the row recorded) says held no more
	if err := still(); err != nil {
		return err
	}
	if err := RemoveEarlier(s, in, ReceiptSuffix, name, in.ReceiptPath); err != nil {
		return err
	}
	return l.RecordDiscardReceipt(ctx, in, dst)
}

// AppliedBeforeRelease is what a held file's receipt adds for the rows
// its runs applied before ops released it (rows.applied_before_release):
// they stand, though the run since (its counts started over) may not have
// reached them again. also: the receipt names rows of the run since too,
// which may be the same rows. "" when there were none.
func AppliedBeforeRelease(in *ledger.Intake, also bool) string {
	n := in.RowsAppliedEarlier
	if n == 0 {
		return ""
	}
	rows := fmt.Sprintf("%d rows", n)
	if n == 1 {
		rows = "1 row"
	}
	if also {
		return fmt.Sprintf("; %s its runs applied before ops released it stand as well (rows.applied_before_release; a row may count in both)", rows)
	}
	return fmt.Sprintf("; %s its runs applied before ops released it stand (rows.applied_before_release)", rows)
}

// discardDetail says what a discard leaves: nothing of the file, or, for
// a file that failed part way (some chunks committed before its retries
// ran out), the rows those chunks put in place, which stay.
func discardDetail(in *ledger.Intake) string {
	if in.ReplayOf != 0 {
		// ops' replay of a file, not a file the partner sent anew
		done := "nothing of the replay was applied"
		if in.RowsAppliedEarlier > 0 {
			done += " since ops released it"
		}
		if n := in.RowsApplied + in.RowsDeleted; n > 0 {
			done = fmt.Sprintf("%d rows the replay applied before it was held stay", n)
		}
		return fmt.Sprintf("after review the held replay of intake %d was closed; %s%s, and what intake %d applied stands as its receipt says", in.ReplayOf, done,
			AppliedBeforeRelease(in, in.RowsApplied+in.RowsDeleted > 0), in.ReplayOf)
	}
	earlier := AppliedBeforeRelease(in, true)
	if n := in.RowsApplied + in.RowsDeleted + in.RowsUnchanged; n > 0 {
		// unchanged rows count: a released file's run counts the rows
		// its first run applied as unchanged
		return fmt.Sprintf("after review the held file was closed for good; %d of its rows were in the target before it was held (applied by it, or already there) and stay (rows.applied, rows.unchanged, rows.deleted)%s; the rest was not applied. Send a corrected file if one is due", n, earlier)
	}
	if in.RowsAppliedEarlier > 0 {
		return fmt.Sprintf("after review the held file was closed for good; %d of its rows, applied by its runs before ops released it, stay (rows.applied_before_release); the rest was not applied. Send a corrected file if one is due", in.RowsAppliedEarlier)
	}
	return "after review the held file was closed for good; nothing of it was applied. Send a corrected file if one is due"
}
