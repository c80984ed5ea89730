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

// File-level reasons of the poison matrix (failure.go).
const (
	// ReasonTargetError: the database refused the file's statements for a
	// reason no retry changes (the target table gone, a permission); the
	// detail names the SQLSTATE.
	ReasonTargetError = "target_error"
	// ReasonRetriesExhausted: the file's runs failed transiently more
	// often, or for longer, than the retry budget allows.
	ReasonRetriesExhausted = "retries_exhausted"
	// ReasonFeedGone: the file's feed left the configuration while the
	// file was in flight.
	ReasonFeedGone = "feed_unconfigured"
)

// Reasons a compressed file is held, unparsed.
const (
	ReasonCompressionNotAllowed = "compression_not_allowed"     // the feed does not accept this compression
	ReasonArchiveInvalid        = "archive_invalid"             // not a readable gzip/zip file
	ReasonArchiveTooLarge       = "archive_too_large"           // expands beyond limits.max_expanded_bytes
	ReasonArchiveEntries        = "archive_entries"             // a zip must hold exactly one file
	ReasonArchiveBadEntry       = "archive_bad_entry"           // an entry name with traversal, an absolute path or unsafe characters
	ReasonArchiveSymlink        = "archive_symlink"             // an entry that is a symbolic link
	ReasonArchiveNested         = "archive_nested"              // an archive inside the archive
	ReasonArchiveDirectory      = "archive_directory_too_large" // a zip's central directory over maxZipEntries or maxZipDirBytes
)
