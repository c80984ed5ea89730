// Package failure is the second failure matrix (docs/failure-matrix.md,
// "Poison") as code: every error a file's run meets is transient, refused
// rows, or final for the file (Classify), with the checks the pipeline
// makes on its own (Transient, RefusedRows, SessionLost) and the error
// that is final whatever is retried (FileError). The pipeline (intake)
// acts on the kinds: a retry on the file's own backoff, the refused rows
// found by bisection, the file failed for good.
package failure

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pkg/sftp"
)

// Kind is what an error a file meets is. Every error a file meets is one of three kinds, and each kind has one outcome.
//
//   - transient: the world, not the file (network, the database away or
//     restarting, serialization failures and deadlocks, lock and statement
//     timeouts, a full disk). The file is retried on its own backoff
//     (the pipeline's recordAttempt), while the partner's other files go on; past the
//     retry budget it fails for good.
//   - refused rows: the target refuses some values (SQLSTATE classes 22
//     and 23 inside a chunk's merge). Exactly those rows are rejected with
//     reason target_refused and their SQLSTATE (the pipeline's refuse.go); the rest apply.
//   - final for the file: anything else the database answers (an undefined
//     table, a permission, a syntax the mapping produced), or a file error
//     of ours. The file ends failed_terminal with a reason, a receipt and
//     an alert, and can be replayed after the fix.
//
// An error nobody classified (a Go error of some library) counts as
// transient: it is retried against the budget, which bounds it. Nothing is
// retried forever.
type Kind int

const (
	KindTransient Kind = iota
	KindRefused
	KindFinal
)

// Classify sorts an error of a file's run.
func Classify(err error) Kind {
	if RefusedRows(err) != nil {
		return KindRefused
	}
	if Transient(err) || TransientIO(err) {
		return KindTransient
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return KindFinal // the server answered, and it will answer the same
	}
	var fe *FileError
	if errors.As(err, &fe) {
		return KindFinal
	}
	return KindTransient
}

// RefusedRows returns the PostgreSQL error when err is a data or integrity
// error (SQLSTATE class 22 or 23): some row's value was refused.
func RefusedRows(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && len(pe.Code) == 5 && (pe.Code[:2] == "22" || pe.Code[:2] == "23") {
		return pe
	}
	return nil
}

// TransientIO: errors of the SFTP session and the local disk that say
// nothing about the file: the connection went away, or the spool's disk
// is full.
func TransientIO(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, sftp.ErrSSHFxConnectionLost), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.As(err, &ne):
		return true
	}
	return false
}

// SessionLost reports whether the partner's SFTP session is gone: every
// other file of the partner would fail the same way, so the poll stops and
// the partner backs off.
func SessionLost(err error) bool {
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

// Transient reports whether err is worth retrying: what pgconn says is safe
// to retry, a SQLSTATE of class 08 (connection), 53000, 53100 or 53300
// (insufficient resources, a full disk, too many connections; not 53200
// or 53400, out of memory or past a configured limit such as
// temp_file_limit, which the same statement meets again), 40001
// (serialization), 40P01 (deadlock), 55P03 (a lock not had within
// lock_timeout, which a role or database may set), 57P01/57P02/57P03
// (server shutdown or restart), 57014 (statement timeout) or 25P03
// (idle-in-transaction timeout: the server ended a stalled session, see
// the daemon's PoolConfig), or a network error. Every
// retry passes the fencing gate again, so a retry after a takeover is
// refused there. Validation and fencing errors are never transient.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var fe *ledger.FencedError
	if errors.As(err, &fe) || errors.Is(err, context.Canceled) {
		return false
	}
	// A connection that died under an earlier statement (a server restart):
	// pgconn says not "safe to retry" as a request may have been sent, but
	// a chunk's transaction is rolled back with its connection, and a
	// COMMIT without an answer never gets here (CommitUnknownError).
	if pgconn.SafeToRetry(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) == 5 && pe.Code[:2] == "08":
			return true
		case pe.Code == "53000", pe.Code == "53100", pe.Code == "53300", pe.Code == "40001", pe.Code == "40P01", pe.Code == "55P03", pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03",
			pe.Code == "57014", pe.Code == "25P03":
			return true
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.Timeout(err)
}
