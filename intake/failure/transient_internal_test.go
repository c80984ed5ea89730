package failure

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// A chunk whose connection died under PostgreSQL's restart is retried on a
// new connection (the pool's next one), not given up after one try: the
// error a dead pgx connection returns on the next statement is transient;
// a fence and a cancellation are not.
func TestAClosedConnectionIsTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("chunk 9 begin: %w", pgconn.ErrConnClosed), true},
		{fmt.Errorf("chunk 9 copy: %w", &pgconn.PgError{Code: "57P01"}), true},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "53300"}), true},        // too many connections
		{fmt.Errorf("chunk 9 copy: %w", &pgconn.PgError{Code: "53100"}), true},   // disk full
		{fmt.Errorf("chunk 9 merge: %w", &pgconn.PgError{Code: "55P03"}), true},  // lock_timeout
		{fmt.Errorf("chunk 9 merge: %w", &pgconn.PgError{Code: "53400"}), false}, // past temp_file_limit: again every time
		{fmt.Errorf("chunk 9 merge: %w", &pgconn.PgError{Code: "23514"}), false}, // a CHECK refused it
		{fmt.Errorf("chunk 9: %w", &ledger.FencedError{}), false},
		{fmt.Errorf("chunk 9: %w", errors.New("mapping refused")), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
