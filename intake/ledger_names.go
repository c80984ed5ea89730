package intake

import "github.com/partner-intake/partner-intake/intake/ledger"

// The ledger's names as the pipeline, its tests and cmd/intake use them
// (intake/ledger owns them and every statement on the ledger's tables).

// Intake is a file's ledger row as a worker holds it.
type Intake = ledger.Intake

// State is a file's state in the ledger.
type State = ledger.State

// The states of a file.
const (
	StateClaimed          = ledger.StateClaimed
	StateSpooled          = ledger.StateSpooled
	StateApplying         = ledger.StateApplying
	StateApplied          = ledger.StateApplied
	StateArchived         = ledger.StateArchived
	StateDuplicate        = ledger.StateDuplicate
	StateQuarantined      = ledger.StateQuarantined
	StateFailedTerminal   = ledger.StateFailedTerminal
	StateOutcomeUnknown   = ledger.StateOutcomeUnknown
	StateDiscarded        = ledger.StateDiscarded
	StatePutBack          = ledger.StatePutBack
	StateAwaitingApproval = ledger.StateAwaitingApproval
)

// FencedError: a conditional write found the row no longer this worker's.
type FencedError = ledger.FencedError

// Verdict is what the batch key says about a spooled file.
type Verdict = ledger.Verdict

// Verdicts.
const (
	VerdictNew       = ledger.VerdictNew
	VerdictDuplicate = ledger.VerdictDuplicate
	VerdictConflict  = ledger.VerdictConflict
)

// IssueRow is one recorded row issue, for the rejects report.
type IssueRow = ledger.IssueRow

// LedgerBehindError: the ledger holds fewer chunks than this worker saw commit.
type LedgerBehindError = ledger.LedgerBehindError

// File-level reason codes (ledger/reasons.go).
const (
	ReasonDuplicate        = ledger.ReasonDuplicate
	ReasonBatchConflict    = ledger.ReasonBatchConflict
	ReasonManifestMismatch = ledger.ReasonManifestMismatch
	ReasonManifestInvalid  = ledger.ReasonManifestInvalid
	ReasonFileTooLarge     = ledger.ReasonFileTooLarge
	ReasonSizeMismatch     = ledger.ReasonSizeMismatch
	ReasonRejectRate       = ledger.ReasonRejectRate
	ReasonBadBatchID       = ledger.ReasonBadBatchID
	ReasonRemoteLost       = ledger.ReasonRemoteLost
	ReasonSuperseded       = ledger.ReasonSuperseded
	// ReasonChangedAfterClaim: readiness stable, the file changed after
	// its claim (stable.go).
	ReasonChangedAfterClaim = ledger.ReasonChangedAfterClaim
	// ReasonNotRegular: the claimed path was not a regular file.
	ReasonNotRegular = ledger.ReasonNotRegular
)

// File-level reasons of the poison matrix (ledger/reasons.go).
const (
	ReasonTargetError      = ledger.ReasonTargetError
	ReasonRetriesExhausted = ledger.ReasonRetriesExhausted
	ReasonFeedGone         = ledger.ReasonFeedGone
	ReasonMappingChanged   = ledger.ReasonMappingChanged
	ReasonPlanRejected     = ledger.ReasonPlanRejected
	ReasonAwaitingApproval = ledger.ReasonAwaitingApproval
	ReasonPlanChanged      = ledger.ReasonPlanChanged
)

// Reasons a compressed file is held, unparsed (ledger/reasons.go).
const (
	ReasonCompressionNotAllowed = ledger.ReasonCompressionNotAllowed
	ReasonArchiveInvalid        = ledger.ReasonArchiveInvalid
	ReasonArchiveTooLarge       = ledger.ReasonArchiveTooLarge
	ReasonArchiveEntries        = ledger.ReasonArchiveEntries
	ReasonArchiveBadEntry       = ledger.ReasonArchiveBadEntry
	ReasonArchiveSymlink        = ledger.ReasonArchiveSymlink
	ReasonArchiveNested         = ledger.ReasonArchiveNested
	ReasonPGPNoKey              = ledger.ReasonPGPNoKey
	ReasonPGPNotEncrypted       = ledger.ReasonPGPNotEncrypted
	ReasonPGPCorrupt            = ledger.ReasonPGPCorrupt
	ReasonPGPUnsigned           = ledger.ReasonPGPUnsigned
	ReasonPGPBadSignature       = ledger.ReasonPGPBadSignature
	ReasonArchiveDirectory      = ledger.ReasonArchiveDirectory
)

// Receipt outcomes, as a partner reads them (ledger/outcome.go).
const (
	OutcomeAccepted            = ledger.OutcomeAccepted
	OutcomeAcceptedWithRejects = ledger.OutcomeAcceptedWithRejects
	OutcomeDuplicate           = ledger.OutcomeDuplicate
	OutcomeQuarantined         = ledger.OutcomeQuarantined
	OutcomeFailed              = ledger.OutcomeFailed
	OutcomeDiscarded           = ledger.OutcomeDiscarded
	OutcomeSuperseded          = ledger.OutcomeSuperseded
)

// Overrides an ops release may grant a held file (ledger/outcome.go).
const (
	OverrideRejectRate     = ledger.OverrideRejectRate
	OverrideManifest       = ledger.OverrideManifest
	OverrideSize           = ledger.OverrideSize
	OverrideConflictNewWin = ledger.OverrideConflictNewWin
	OverrideNothing        = ledger.OverrideNothing
)

// Reason is a file-level reason code (ledger/reasons.go).
type Reason = ledger.Reason

// Outcome is a receipt's outcome (ledger/outcome.go).
type Outcome = ledger.Outcome
