package failure

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/internal/reason"
)

// Each error a file's run meets has one kind: a refused value is refused
// rows, what the server answers otherwise (or a FileError) is final, the
// world's errors and anything unclassified are transient.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Kind
	}{
		{&pgconn.PgError{Code: "23505"}, KindRefused},
		{fmt.Errorf("merge: %w", &pgconn.PgError{Code: "22003"}), KindRefused},
		{&pgconn.PgError{Code: "42P01"}, KindFinal},
		{&FileError{Reason: reason.TargetRefused, Detail: "x"}, KindFinal},
		{&pgconn.PgError{Code: "40001"}, KindTransient},
		{fmt.Errorf("spool: %w", syscall.ENOSPC), KindTransient},
		{errors.New("some library's error"), KindTransient},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !SessionLost(fmt.Errorf("read: %w", syscall.ECONNRESET)) || SessionLost(syscall.ENOSPC) {
		t.Error("SessionLost: a reset connection is a lost session, a full disk is not")
	}
}
