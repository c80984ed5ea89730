// Package rows reads a partner's CSV file in its declared dialect and
// validates every row against the feed's columns. It never guesses: what
// does not match the declaration gets a reason code, and no reason or error
// carries a cell value.
package rows

import "fmt"

// Row reason codes: the row is rejected, the file goes on.
const (
	ReasonRequiredMissing = "required_missing"
	ReasonTooLong         = "too_long"
	ReasonNotInteger      = "not_integer"
	ReasonNotDecimal      = "not_decimal"
	ReasonScaleExceeded   = "scale_exceeded"
	ReasonBadDate         = "bad_date"
	ReasonBadTimestamp    = "bad_timestamp"
	ReasonNotInEnum       = "not_in_enum"
	ReasonBadEmail        = "bad_email"
	ReasonFieldCount      = "field_count"
	ReasonCSVSyntax       = "csv_syntax"
	ReasonFieldTooLong    = "field_too_long"
)

// ReasonPrecisionExceeded: a row's integer or decimal cell has more digits
// before the point than the column's precision (less its scale) allows.
const ReasonPrecisionExceeded = "precision_exceeded"

// File reason codes: the whole file fails terminally, no retry.
const (
	ReasonHeaderMismatch  = "header_mismatch"
	ReasonInvalidEncoding = "invalid_encoding"
	ReasonBinaryContent   = "binary_content"
	ReasonLineTooLong     = "line_too_long"
	ReasonRecordTooLarge  = "record_too_large" // a record over csv.max_record_bytes, quoted lines included
	ReasonEmptyFile       = "empty_file"
	ReasonTooManyRows     = "too_many_rows"
	ReasonUnreadable      = "unreadable"
)

// Issue is why one row did not apply.
type Issue struct {
	Line   int64
	Column string // "" when the row as a whole is at fault
	Reason string
}

// FileError is a terminal problem with the whole file.
type FileError struct {
	Reason string
	Line   int64
	// Detail explains in words; it never holds partner data.
	Detail string
}

func (e *FileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s at line %d: %s", e.Reason, e.Line, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Reason, e.Detail)
}

// Row reason codes the merge into the target gives (intake/target): the
// row is not written, the file goes on.
const (
	// ReasonOutsideEdit: the row was changed outside intake since intake
	// last wrote it; the feed keeps such edits (on_outside_edit: keep).
	// Outcome conflict.
	ReasonOutsideEdit = "outside_edit"
	// ReasonExists: an insert_only feed's row whose key the target holds
	// already. Outcome conflict.
	ReasonExists = "exists"
	// ReasonNotFound: an update_only feed's row whose key the target does
	// not hold. Outcome rejected.
	ReasonNotFound = "not_found"
)

// OutcomeDeleted is the row outcome of a snapshot's sweep: a row of the
// partner's earlier files whose key the snapshot lacks was deleted (or
// marked in the feed's deleted_at column). Receipts count it apart from
// the file's own rows.
const OutcomeDeleted = "deleted"
