// Package reason is intake's one vocabulary of reason codes: why an entry
// of ready/ is not claimed (skip), why a row did not apply (row), why a
// file did not simply apply (file). Each code is declared once below, and
// once in the registry with its kinds and meaning (All).
//
// The values are stored (file_intake.reason, intake_row_issue.reason, the
// reconciler's findings), written to receipts, rejects reports and
// quarantine reason files, logged, and used as Prometheus label values:
// a value never changes. docs/partner-guide.md explains every one (its
// test holds the guide to All).
//
// It imports nothing of the module: every layer may name its codes.
package reason

import "strings"

// Code is a reason code; "" is none.
type Code string

// Kind is what a code can be the reason of: a set, since a code may be
// the reason of more than one (a non-regular file is skipped in a listing,
// and held when the claim moved one).
type Kind uint8

const (
	// KindSkip: an entry of ready/ not claimed (intake_skipped_total's
	// reason label).
	KindSkip Kind = 1 << iota
	// KindRow: a row rejected or in conflict, the rest of the file goes on
	// (intake_row_issue.reason, the rejects report).
	KindRow
	// KindFile: a file that did not simply apply: failed, held or not
	// applied (file_intake.reason, the receipt's reason).
	KindFile
)

// Has reports whether k includes every kind of o.
func (k Kind) Has(o Kind) bool { return o != 0 && k&o == o }

func (k Kind) String() string {
	var s []string
	for _, n := range []struct {
		k    Kind
		name string
	}{{KindSkip, "skip"}, {KindRow, "row"}, {KindFile, "file"}} {
		if k.Has(n.k) {
			s = append(s, n.name)
		}
	}
	return strings.Join(s, "+")
}

// Skip reasons: an entry of ready/ that is not claimed (partners/ready.go).
const (
	Dotfile       Code = "dotfile"
	PartialUpload Code = "partial_upload"
	// NotRegularFile, BadName, DeceptiveName and NoFeed are also file
	// reasons: a hostile entry (partners.Hostile) is claimed and held
	// with its skip code.
	NotRegularFile  Code = "not_regular_file"
	BadName         Code = "bad_name"
	DeceptiveName   Code = "deceptive_name"
	NoFeed          Code = "no_feed"
	ManifestMissing Code = "manifest_missing"
	ManifestFile    Code = "manifest_file"
	IgnoredName     Code = "ignored_name"
	NotStable       Code = "not_stable"
	TargetUnusable  Code = "target_unusable"
	ImpossibleName  Code = "impossible_name"
)

// Row reasons of validation (intake/rows): the row is rejected, the file
// goes on.
const (
	RequiredMissing   Code = "required_missing"
	TooLong           Code = "too_long"
	NotInteger        Code = "not_integer"
	NotDecimal        Code = "not_decimal"
	ScaleExceeded     Code = "scale_exceeded"
	PrecisionExceeded Code = "precision_exceeded"
	BadDate           Code = "bad_date"
	BadTimestamp      Code = "bad_timestamp"
	NotInEnum         Code = "not_in_enum"
	BadEmail          Code = "bad_email"
	FieldCount        Code = "field_count"
	CSVSyntax         Code = "csv_syntax"
	FieldTooLong      Code = "field_too_long"
)

// Row reasons of the merge into the target (intake/target) and of the
// rows it refuses (intake/refuse.go).
const (
	DuplicateKey  Code = "duplicate_key"
	NewerWrite    Code = "newer_write"
	OutsideEdit   Code = "outside_edit"
	Exists        Code = "exists"
	NotFound      Code = "not_found"
	TargetRefused Code = "target_refused"
)

// File reasons of reading the CSV (intake/rows): the file fails
// terminally, no retry.
const (
	HeaderMismatch  Code = "header_mismatch"
	InvalidEncoding Code = "invalid_encoding"
	BinaryContent   Code = "binary_content"
	LineTooLong     Code = "line_too_long"
	RecordTooLarge  Code = "record_too_large"
	EmptyFile       Code = "empty_file"
	TooManyRows     Code = "too_many_rows"
	Unreadable      Code = "unreadable"
)

// File reasons of the file's run (intake, intake/ledger).
const (
	Duplicate         Code = "duplicate"
	BatchConflict     Code = "batch_conflict"
	ManifestMismatch  Code = "manifest_mismatch"
	ManifestInvalid   Code = "manifest_invalid"
	FileTooLarge      Code = "file_too_large"
	SizeMismatch      Code = "size_mismatch"
	RejectRate        Code = "reject_rate_exceeded"
	BadBatchID        Code = "bad_batch_id"
	RemoteLost        Code = "remote_lost"
	Superseded        Code = "superseded"
	ChangedAfterClaim Code = "changed_after_claim"
	TargetError       Code = "target_error"
	RetriesExhausted  Code = "retries_exhausted"
	FeedGone          Code = "feed_unconfigured"
	MappingChanged    Code = "mapping_changed"
	HostileEntry      Code = "hostile_entry"
)

// File reasons of a compressed file, held unparsed (intake/expand.go).
const (
	CompressionNotAllowed Code = "compression_not_allowed"
	ArchiveInvalid        Code = "archive_invalid"
	ArchiveTooLarge       Code = "archive_too_large"
	ArchiveEntries        Code = "archive_entries"
	ArchiveBadEntry       Code = "archive_bad_entry"
	ArchiveSymlink        Code = "archive_symlink"
	ArchiveNested         Code = "archive_nested"
	ArchiveDirectory      Code = "archive_directory_too_large"
)

// File reasons of a feed with pgp: the file is held, its plaintext never
// applied (intake/pgp.go).
const (
	PGPNoKey        Code = "pgp_no_key"
	PGPNotEncrypted Code = "pgp_not_encrypted"
	PGPCorrupt      Code = "pgp_corrupt"
	PGPUnsigned     Code = "pgp_unsigned"
	PGPBadSignature Code = "pgp_bad_signature"
)

// File reasons of plans and approval (intake/approval.go).
const (
	PlanRejected     Code = "plan_rejected"
	AwaitingApproval Code = "awaiting_approval"
	PlanChanged      Code = "plan_changed"
)

// Info is one code of the registry.
type Info struct {
	Code    Code
	Kind    Kind
	Meaning string // one line
}

// registry: every code above, once, with its kinds and meaning.
var registry = []Info{
	{Dotfile, KindSkip, "a name starting with a dot: never claimed"},
	{PartialUpload, KindSkip, "a name ending in .part: an upload still being written"},
	{NotRegularFile, KindSkip | KindFile, "a symbolic link, directory or device: never followed or read; hostile, held unread (also when the claim's RENAME moved one)"},
	{BadName, KindSkip | KindFile, "a name with control characters, separators or invalid UTF-8, or too long: hostile, held unread"},
	{DeceptiveName, KindSkip | KindFile, "a name that shows other than it is (Unicode format characters such as bidirectional overrides and zero-width characters, or a line or paragraph separator): hostile, held unread"},
	{NoFeed, KindSkip | KindFile, "no feed of the partner matches the name: hostile, held unread"},
	{ManifestMissing, KindSkip, "manifest mode: the data file's manifest is not there yet"},
	{ManifestFile, KindSkip, "manifest mode: a manifest, read with its data file, never claimed itself"},
	{IgnoredName, KindSkip, "readiness stable: the name matches stable.ignore (an upload tool's temporary name)"},
	{NotStable, KindSkip, "readiness stable: size or mtime changed within stable_for, or younger than min_age"},
	{TargetUnusable, KindSkip, "the file's feed is held, its target table cannot be written: the file waits in ready/"},
	{ImpossibleName, KindSkip, "a name no directory holds (\"/\", \"a/../b\", empty): left out of the listing, never moved or named in a path"},

	{RequiredMissing, KindRow, "a required column is empty"},
	{TooLong, KindRow, "a cell longer than the column's max_length"},
	{NotInteger, KindRow, "not a whole number"},
	{NotDecimal, KindRow, "not a decimal number"},
	{ScaleExceeded, KindRow, "more digits after the point than the column's scale"},
	{PrecisionExceeded, KindRow, "more digits before the point than the column's precision (less its scale) allows"},
	{BadDate, KindRow, "not a date in the column's layout, or in year 0"},
	{BadTimestamp, KindRow, "not a timestamp in the column's layout, or in year 0"},
	{NotInEnum, KindRow, "not one of the column's allowed values"},
	{BadEmail, KindRow, "not an e-mail address"},
	{FieldCount, KindRow, "more or fewer fields than the header"},
	{CSVSyntax, KindRow, "broken quoting on the line"},
	{FieldTooLong, KindRow, "one field larger than the dialect's limit"},

	{DuplicateKey, KindRow, "an earlier line of the same chunk repeats the key (as the target compares keys); the later line won"},
	{NewerWrite, KindRow, "a newer delivery already wrote the key: outcome conflict"},
	{OutsideEdit, KindRow, "the row was changed outside intake since intake last wrote it, and the feed keeps such edits: outcome conflict"},
	{Exists, KindRow, "an insert_only feed's row whose key the target holds already: outcome conflict"},
	{NotFound, KindRow, "an update_only feed's row whose key the target does not hold: outcome rejected"},
	{TargetRefused, KindRow | KindFile, "the target refused the row (a CHECK, a foreign key, a length; the detail names the SQLSTATE); a file whose chunk has more refused rows than intake probes for fails with it"},

	{HeaderMismatch, KindFile, "the header does not name the feed's columns in order"},
	{InvalidEncoding, KindFile, "bytes invalid in the feed's encoding"},
	{BinaryContent, KindFile, "the file is not text"},
	{LineTooLong, KindFile, "a line over the dialect's maximum line length"},
	{RecordTooLarge, KindFile, "a record over csv.max_record_bytes (quoted lines included), or with far more fields than the feed's columns"},
	{EmptyFile, KindFile, "no data rows"},
	{TooManyRows, KindFile, "more rows than the feed's limit"},
	{Unreadable, KindFile, "the file could not be read as CSV"},

	{Duplicate, KindFile, "same batch, same bytes as an earlier file"},
	{BatchConflict, KindFile, "same batch, other bytes: held"},
	{ManifestMismatch, KindFile, "bytes, sha256 or rows disagree with the manifest: held"},
	{ManifestInvalid, KindFile, "the manifest cannot be read or parsed"},
	{FileTooLarge, KindFile, "over limits.max_file_bytes"},
	{SizeMismatch, KindFile, "downloaded bytes differ from the listed size twice"},
	{RejectRate, KindFile, "more rejected rows than the feed allows: held"},
	{BadBatchID, KindFile, "no usable batch id"},
	{RemoteLost, KindFile, "the claimed file vanished before its bytes were safe"},
	{Superseded, KindFile, "a snapshot older than one its feed already applied: archived, not applied"},
	{ChangedAfterClaim, KindFile, "readiness stable: size or mtime changed between the listing and the end of the download: put back into ready/, not applied"},
	{TargetError, KindFile, "the database refused the file's statements for a reason no retry changes (the detail names the SQLSTATE)"},
	{RetriesExhausted, KindFile, "the file's runs failed transiently more often, or for longer, than the retry budget allows"},
	{FeedGone, KindFile, "the file's feed left the configuration while the file was in flight"},
	{MappingChanged, KindFile, "the feed's configuration changed while the file was part way through its apply: the rest is not applied under another mapping"},
	{HostileEntry, KindFile, "a hostile entry held whose own code its claimed name no longer tells: held unread"},

	{CompressionNotAllowed, KindFile, "compressed, and the feed does not accept this compression"},
	{ArchiveInvalid, KindFile, "not a readable gzip or zip file"},
	{ArchiveTooLarge, KindFile, "expands beyond limits.max_expanded_bytes, or beyond limits.max_expansion_ratio times its size"},
	{ArchiveEntries, KindFile, "a zip not holding exactly one file"},
	{ArchiveBadEntry, KindFile, "an entry name with traversal, an absolute path or unsafe characters"},
	{ArchiveSymlink, KindFile, "an entry that is a symbolic link"},
	{ArchiveNested, KindFile, "an archive inside the archive"},
	{ArchiveDirectory, KindFile, "a zip's central directory with too many entries or too large"},

	{PGPNoKey, KindFile, "pgp feed: not encrypted to intake's key"},
	{PGPNotEncrypted, KindFile, "pgp feed: an OpenPGP message, but not encrypted (signed or literal only)"},
	{PGPCorrupt, KindFile, "pgp feed: not OpenPGP, truncated, or its integrity check fails"},
	{PGPUnsigned, KindFile, "pgp feed with require_signature: the message is not signed"},
	{PGPBadSignature, KindFile, "pgp feed: signed by a key not in verify_keys_file, or the signature does not match"},

	{PlanRejected, KindFile, "ops rejected the file's plan: quarantined, nothing of it applied"},
	{AwaitingApproval, KindFile, "the file's plan waits for an ops decision (not in a receipt)"},
	{PlanChanged, KindFile, "an approved plan no longer held when the file was about to be applied: it waits again with its new plan (not in a receipt)"},
}

// All lists every code with its kinds and meaning, in the order declared.
func All() []Info {
	return append([]Info(nil), registry...)
}

// Lookup is code's registry entry.
func Lookup(code Code) (Info, bool) {
	for _, in := range registry {
		if in.Code == code {
			return in, true
		}
	}
	return Info{}, false
}
