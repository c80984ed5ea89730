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
