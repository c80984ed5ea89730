package intake

import "github.com/partner-intake/partner-intake/intake/failure"

// The three outcomes of an error a file's run meets are intake/failure's;
// the pipeline names them so.
// FileError is a failure that is final for the file whatever is retried
// (the mapping cannot be applied, say): its Reason goes to the receipt.
type FileError = failure.FileError

const (
	kindRefused = failure.KindRefused
	kindFinal   = failure.KindFinal
)

var (
	classify    = failure.Classify
	refusedRows = failure.RefusedRows
	transient   = failure.Transient
	sessionLost = failure.SessionLost
)
