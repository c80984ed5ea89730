// Package sitename holds the names intake gives what it writes on a
// partner's site beside the partner's own files (reports, reason files,
// hidden temporary names), so the pipeline that writes them and the
// reconciler and ops views that find them agree on one spelling.
package sitename

import "regexp"

// Suffixes of a file's reports.
const (
	ReceiptSuffix = ".receipt.json"
	RejectsSuffix = ".rejects.csv"
)

// ReasonSuffix ends the name of the reason file beside a held file.
const ReasonSuffix = ".reason.json"

// EncryptedSuffix ends the name of a report encrypted to the partner's
// key (pgp.encrypt_reports_to).
const EncryptedSuffix = ".asc"

// tempPattern matches the hidden temporary names the pipeline writes under:
// .<name>.<16 hex>.tmp (the reconciler removes stale ones).
var tempPattern = regexp.MustCompile(`^\..*\.[0-9a-f]{16}\.tmp$`)

// IsOurTemp reports whether name is one of the pipeline's temporary names.
func IsOurTemp(name string) bool { return tempPattern.MatchString(name) }
