package pgerr

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRedactKeepsCodesAndDropsValues(t *testing.T) {
	pe := &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: `duplicate key value violates unique constraint "orders_email"`,
		Detail: "Key (partner_id, email)=(acme, secret@example.com) already exists.", ConstraintName: "orders_email", TableName: "orders"}
	err := fmt.Errorf("intake 7: chunk 0 merge: %w", pe)
	got := Redact(err)
	if strings.Contains(got, "secret") || strings.Contains(got, "duplicate key") {
		t.Fatalf("Redact kept PostgreSQL's text: %q", got)
	}
	for _, want := range []string{"intake 7: chunk 0 merge", "SQLSTATE 23505", "unique_violation", "constraint orders_email", "table orders"} {
		if !strings.Contains(got, want) {
			t.Fatalf("Redact(%v) = %q, want it to contain %q", err, got, want)
		}
	}
	plain := errors.New("sftp: no such file")
	if Redact(plain) != plain.Error() {
		t.Fatalf("an error without a PostgreSQL error changed: %q", Redact(plain))
	}

	// a wrapper that quoted the message alone, and the log handler
	quoted := fmt.Errorf("merge failed (%s): %w", pe.Message, pe)
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewTextHandler(&buf, nil))).With("err0", quoted)
	log.Warn("x", "err", err)
	if strings.Contains(buf.String(), "secret") || strings.Contains(buf.String(), "duplicate key") || !strings.Contains(buf.String(), "SQLSTATE 23505") {
		t.Fatalf("log line: %s", buf.String())
	}
}
