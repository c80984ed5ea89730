package ledger

// Outcome is a receipt's outcome, as a partner reads it.
type Outcome string

// Receipt outcomes, as a partner reads them.
const (
	OutcomeAccepted            Outcome = "accepted"
	OutcomeAcceptedWithRejects Outcome = "accepted_with_rejects"
	OutcomeDuplicate           Outcome = "duplicate"
	OutcomeQuarantined         Outcome = "quarantined"
	OutcomeFailed              Outcome = "failed"
	OutcomeDiscarded           Outcome = "discarded" // held, then closed for good by ops
	// OutcomeSuperseded: a snapshot older than one the feed already
	// applied; archived, never applied (any more), the receipt naming the
	// newer intake.
	OutcomeSuperseded Outcome = "superseded"
)

// Overrides an ops release may grant a held file.
const (
	OverrideRejectRate     = "reject_rate"       // apply the valid rows although more were rejected than allowed
	OverrideManifest       = "manifest"          // accept the bytes although they disagree with the manifest
	OverrideSize           = "size"              // download although the file is over max_file_bytes
	OverrideConflictNewWin = "conflict_new_wins" // the held bytes replace the batch's earlier bytes
	// OverrideNothing marks a release that overrides no check (the file
	// failed for a cause since fixed): every released file carries an
	// override, so its worker knows to remove the reason file it was held
	// with once it decides the file again.
	OverrideNothing = "released"
)
