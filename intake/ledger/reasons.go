package ledger

// File-level reason codes written to file_intake.reason, receipts and
// quarantine reason files. Row-level and parse reasons live in intake/rows.
const (
	ReasonDuplicate        = "duplicate"            // same batch, same bytes as an earlier file
	ReasonBatchConflict    = "batch_conflict"       // same batch, other bytes
	ReasonManifestMismatch = "manifest_mismatch"    // bytes/sha256/rows disagree with the manifest
	ReasonManifestInvalid  = "manifest_invalid"     // the manifest cannot be read or parsed
	ReasonFileTooLarge     = "file_too_large"       // over limits.max_file_bytes
	ReasonSizeMismatch     = "size_mismatch"        // downloaded bytes differ from the listed size twice
	ReasonRejectRate       = "reject_rate_exceeded" // more rejected rows than the feed allows
	ReasonBadBatchID       = "bad_batch_id"         // no usable batch id
	ReasonRemoteLost       = "remote_lost"          // the claimed file vanished before its bytes were safe
)
