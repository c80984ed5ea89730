package ledger

// Reason is a file-level reason code, written to file_intake.reason,
// receipts and quarantine reason files. Row-level and parse reasons live
// in intake/rows.
type Reason string

// File-level reason codes.
const (
	ReasonDuplicate        Reason = "duplicate"            // same batch, same bytes as an earlier file
	ReasonBatchConflict    Reason = "batch_conflict"       // same batch, other bytes
	ReasonManifestMismatch Reason = "manifest_mismatch"    // bytes/sha256/rows disagree with the manifest
	ReasonManifestInvalid  Reason = "manifest_invalid"     // the manifest cannot be read or parsed
	ReasonFileTooLarge     Reason = "file_too_large"       // over limits.max_file_bytes
	ReasonSizeMismatch     Reason = "size_mismatch"        // downloaded bytes differ from the listed size twice
	ReasonRejectRate       Reason = "reject_rate_exceeded" // more rejected rows than the feed allows
	ReasonBadBatchID       Reason = "bad_batch_id"         // no usable batch id
	ReasonRemoteLost       Reason = "remote_lost"          // the claimed file vanished before its bytes were safe
	ReasonSuperseded       Reason = "superseded"           // a snapshot older than one its feed already applied
	// ReasonChangedAfterClaim: readiness stable, the file's size or mtime
	// changed between its listing and the end of its download (the
	// partner was still writing): put back into ready/, not applied.
	ReasonChangedAfterClaim Reason = "changed_after_claim"
	// ReasonNotRegular: the claimed path was not a regular file (a
	// symbolic link, directory or device put into ready/ after the
	// listing, moved by the claim's RENAME): held unread, never followed;
	// like a hostile entry of the same name (partners.SkipNotRegular) it
	// can only be discarded.
	ReasonNotRegular Reason = "not_regular_file"
)

// File-level reasons of the poison matrix (failure.go).
const (
	// ReasonTargetError: the database refused the file's statements for a
	// reason no retry changes (the target table gone, a permission); the
	// detail names the SQLSTATE.
	ReasonTargetError Reason = "target_error"
	// ReasonRetriesExhausted: the file's runs failed transiently more
	// often, or for longer, than the retry budget allows.
	ReasonRetriesExhausted Reason = "retries_exhausted"
	// ReasonFeedGone: the file's feed left the configuration while the
	// file was in flight.
	ReasonFeedGone Reason = "feed_unconfigured"
	// ReasonMappingChanged: the feed's configuration changed while the
	// file was part way through its apply (a resume after a restart, a
	// takeover or a retry found another configuration than the one that
	// planned it): its remaining chunks are not applied under another
	// mapping. Released, it starts over as a whole under the new one.
	ReasonMappingChanged Reason = "mapping_changed"
)

// Reasons a compressed file is held, unparsed.
const (
	ReasonCompressionNotAllowed Reason = "compression_not_allowed"     // the feed does not accept this compression
	ReasonArchiveInvalid        Reason = "archive_invalid"             // not a readable gzip/zip file
	ReasonArchiveTooLarge       Reason = "archive_too_large"           // expands beyond limits.max_expanded_bytes, or a .gz/.zip beyond limits.max_expansion_ratio times its size
	ReasonArchiveEntries        Reason = "archive_entries"             // a zip must hold exactly one file
	ReasonArchiveBadEntry       Reason = "archive_bad_entry"           // an entry name with traversal, an absolute path or unsafe characters
	ReasonArchiveSymlink        Reason = "archive_symlink"             // an entry that is a symbolic link
	ReasonArchiveNested         Reason = "archive_nested"              // an archive inside the archive
	ReasonArchiveDirectory      Reason = "archive_directory_too_large" // a zip's central directory over maxZipEntries or maxZipDirBytes
)

// Reasons a file of a feed with pgp is held, its plaintext never applied.
const (
	ReasonPGPNoKey        Reason = "pgp_no_key"        // not encrypted to intake's key
	ReasonPGPNotEncrypted Reason = "pgp_not_encrypted" // an OpenPGP message, but not encrypted (signed or literal only)
	ReasonPGPCorrupt      Reason = "pgp_corrupt"       // not OpenPGP, truncated, or its integrity check fails
	ReasonPGPUnsigned     Reason = "pgp_unsigned"      // require_signature, and the message is not signed
	ReasonPGPBadSignature Reason = "pgp_bad_signature" // signed, but by a key not in verify_keys_file, or the signature does not match
)

// Reasons of plans and approval (approval.go).
const (
	// ReasonPlanRejected: ops rejected the file's plan (intake reject):
	// the file is quarantined, nothing of it applied.
	ReasonPlanRejected Reason = "plan_rejected"
	// ReasonAwaitingApproval: the file's plan waits for an ops decision
	// (file_intake.reason while awaiting_approval; the policy's threshold
	// is in the audit and `intake plan show`).
	ReasonAwaitingApproval Reason = "awaiting_approval"
	// ReasonPlanChanged: an approved plan no longer held when the file was
	// about to be applied (the target or the mapping changed since): the
	// file waits again with its new plan (audit action replan).
	ReasonPlanChanged Reason = "plan_changed"
)
