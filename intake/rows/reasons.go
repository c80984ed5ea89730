// Package rows reads a partner's CSV file in its declared dialect and
// validates every row against the feed's columns. It never guesses: what
// does not match the declaration gets a reason code (internal/reason: a
// row code rejects the row, a file code fails the file), and no reason or
// error carries a cell value.
package rows

import (
	"fmt"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// Issue is why one row did not apply.
type Issue struct {
	Line   int64
	Column string // "" when the row as a whole is at fault
	Reason reason.Code
}

// FileError is a terminal problem with the whole file.
type FileError struct {
	Reason reason.Code
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

// OutcomeDeleted is the row outcome of a snapshot's sweep: a row of the
// partner's earlier files whose key the snapshot lacks was deleted (or
// marked in the feed's deleted_at column). Receipts count it apart from
// the file's own rows.
const OutcomeDeleted = "deleted"
