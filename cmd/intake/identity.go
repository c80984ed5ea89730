package main

import (
	"context"
	"fmt"
	"io"

	"github.com/partner-intake/partner-intake/internal/inert"
)

// actingAs prints, as an ops command is about to act, the one line that
// says who it acts as: the database's login role (session_user, which the
// audit records as db_user whatever --actor says) and the --actor given.
// It never stops the command: when the database cannot tell (it went
// away), the line says so, and the action meets the same error and
// reports what became of its row.
func actingAs(ctx context.Context, e *env, actor string, stdout io.Writer) {
	var user string
	if err := e.pool.QueryRow(ctx, `SELECT session_user::text`).Scan(&user); err != nil {
		fmt.Fprintf(stdout, "acting as database user (unknown: %s), actor %s\n", inert.Text(err.Error()), inert.Quote(actor))
		return
	}
	fmt.Fprintf(stdout, "acting as database user %s, actor %s\n", inert.Quote(user), inert.Quote(actor))
}

// dbUser is an audit row's database user as `intake audit` shows it: "-"
// for rows recorded before the audit recorded it.
func dbUser(u string) string {
	if u == "" {
		return "-"
	}
	return inert.Text(u)
}

// runsPipeline reports whether the command's database role may run the
// pipeline (write a chunk's ledger row, as the daemon's role and the
// tables' owner may): `intake replay` then applies the replay itself;
// the ops role records it and hands it to a daemon. false when the
// database cannot tell: the replay is then only recorded, which any role
// that may record it can do.
func runsPipeline(ctx context.Context, e *env) bool {
	var may bool
	err := e.pool.QueryRow(ctx, `SELECT pg_catalog.has_table_privilege('intake_chunk'::text, 'INSERT'::text)`).Scan(&may)
	return err == nil && may
}
