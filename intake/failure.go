package intake

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pkg/sftp"
)

// The second failure matrix (docs/failure-matrix.md, "Poison"): every
// error a file meets is one of three kinds, and each kind has one outcome.
//
//   - transient: the world, not the file (network, the database away or
//     restarting, serialization failures and deadlocks, lock and statement
//     timeouts, a full disk). The file is retried on its own backoff
//     (recordAttempt), while the partner's other files go on; past the
//     retry budget it fails for good.
//   - refused rows: the target refuses some values (SQLSTATE classes 22
//     and 23 inside a chunk's merge). Exactly those rows are rejected with
//     reason target_refused and their SQLSTATE (refuse.go); the rest apply.
//   - final for the file: anything else the database answers (an undefined
//     table, a permission, a syntax the mapping produced), or a file error
//     of ours. The file ends failed_terminal with a reason, a receipt and
//     an alert, and can be replayed after the fix.
//
// An error nobody classified (a Go error of some library) counts as
// transient: it is retried against the budget, which bounds it. Nothing is
// retried forever.
type errKind int

const (
	kindTransient errKind = iota
	kindRefused
	kindFinal
)

// classify sorts an error of a file's run.
func classify(err error) errKind {
	if refusedRows(err) != nil {
		return kindRefused
	}
	if transient(err) || transientIO(err) {
		return kindTransient
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return kindFinal // the server answered, and it will answer the same
	}
	var fe *FileError
	if errors.As(err, &fe) {
		return kindFinal
	}
	return kindTransient
}

// refusedRows returns the PostgreSQL error when err is a data or integrity
// error (SQLSTATE class 22 or 23): some row's value was refused.
func refusedRows(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 && (pe.Code[:2] == "22" || pe.Code[:2] == "23") {
		return pe
	}
	return nil
}

// transientIO: errors of the SFTP session and the local disk that say
// nothing about the file: the connection went away, or the spool's disk
// is full.
func transientIO(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, sftp.ErrSSHFxConnectionLost), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.As(err, &ne):
		return true
	}
	return false
}

// sessionLost reports whether the partner's SFTP session is gone: every
// other file of the partner would fail the same way, so the poll stops and
// the partner backs off.
func sessionLost(err error) bool {
	return errors.Is(err, sftp.ErrSSHFxConnectionLost) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// FileError is a failure that is final for the file whatever is retried
// (the mapping cannot be applied, say): its Reason goes to the receipt.
type FileError struct {
	Reason reason.Code
	Detail string
}

func (e *FileError) Error() string { return string(e.Reason) + ": " + e.Detail }
