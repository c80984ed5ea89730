// Package pgerr reduces errors to what may leave the database: PostgreSQL's
// own texts quote cell values ("value too long", "invalid input syntax for
// type integer: …", a unique violation's key), and values never leave the
// database. Logs, last_error, /readyz, receipts and reconciler findings
// carry the SQLSTATE, condition, constraint, table and column instead.
package pgerr

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Redact renders an error for logs, last_error, /readyz and receipts:
// every PostgreSQL error in it is reduced to its SQLSTATE, condition
// name, constraint, table and column. PostgreSQL's own texts quote values
// ("value too long", "invalid input syntax for type integer: …", a
// unique violation's key), and values never leave the database.
func Redact(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		s = strings.ReplaceAll(s, pe.Error(), Codes(pe))
		// a wrapper may have quoted the message alone
		if pe.Message != "" {
			s = strings.ReplaceAll(s, pe.Message, "(message withheld)")
		}
		if pe.Detail != "" {
			s = strings.ReplaceAll(s, pe.Detail, "(detail withheld)")
		}
	}
	return s
}

// Codes is what may be said of a PostgreSQL error outside the database.
func Codes(pe *pgconn.PgError) string {
	var b strings.Builder
	b.WriteString("SQLSTATE ")
	b.WriteString(pe.Code)
	if n := sqlstateNames[pe.Code]; n != "" {
		b.WriteString(" (" + n + ")")
	}
	for _, kv := range [][2]string{{"constraint", pe.ConstraintName}, {"table", pe.TableName}, {"column", pe.ColumnName}} {
		if kv[1] != "" {
			b.WriteString(" " + kv[0] + " " + kv[1])
		}
	}
	return b.String()
}

// sqlstateNames names the conditions a file most often meets.
var sqlstateNames = map[string]string{
	"22001": "string_data_right_truncation", "22003": "numeric_value_out_of_range",
	"22007": "invalid_datetime_format", "22008": "datetime_field_overflow", "22P02": "invalid_text_representation",
	"22012": "division_by_zero", "22021": "character_not_in_repertoire",
	"23502": "not_null_violation", "23503": "foreign_key_violation", "23505": "unique_violation",
	"23514": "check_violation", "23P01": "exclusion_violation",
	"40001": "serialization_failure", "40P01": "deadlock_detected", "55P03": "lock_not_available",
	"57014": "query_canceled", "57P01": "admin_shutdown", "42P01": "undefined_table",
	"42703": "undefined_column", "42501": "insufficient_privilege", "53100": "disk_full",
}

// ReplaceAttr is a slog.HandlerOptions.ReplaceAttr that passes every error
// attribute through Redact, so no log line carries a database's quote of
// a value, whoever logged it.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindAny {
		if err, ok := a.Value.Any().(error); ok {
			return slog.String(a.Key, Redact(err))
		}
	}
	return a
}

// Handler wraps a slog.Handler so that every error attribute passes
// through Redact, whatever handler options the embedding program chose.
func Handler(h slog.Handler) slog.Handler {
	if _, ok := h.(redacting); ok {
		return h
	}
	return redacting{h}
}

type redacting struct{ slog.Handler }

func (r redacting) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, rec.Message, rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(ReplaceAttr(nil, a))
		return true
	})
	return r.Handler.Handle(ctx, out)
}

func (r redacting) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = ReplaceAttr(nil, a)
	}
	return redacting{r.Handler.WithAttrs(red)}
}

func (r redacting) WithGroup(name string) slog.Handler { return redacting{r.Handler.WithGroup(name)} }
