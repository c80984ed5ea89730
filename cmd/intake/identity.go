package main

import (
	"context"
	"fmt"
	"io"

	"github.com/partner-intake/partner-intake/internal/inert"
)

// actingAs prints, before an ops command acts, the one line that says
// who it acts as: the database's login role (session_user, what the audit
// records as db_user whatever --actor says) and the --actor given. It
// reports false, having said why on stderr, when the database cannot
// tell: the command then does not act.
func actingAs(ctx context.Context, e *env, actor string, stdout, stderr io.Writer) bool {
	var user string
	if err := e.pool.QueryRow(ctx, `SELECT session_user::text`).Scan(&user); err != nil {
		fmt.Fprintln(stderr, "database:", err)
		return false
	}
	fmt.Fprintf(stdout, "acting as database user %s, actor %s\n", inert.Quote(user), inert.Quote(actor))
	return true
}

// dbUser is an audit row's database user as `intake audit` shows it: "-"
// for rows recorded before the audit recorded it.
func dbUser(u string) string {
	if u == "" {
		return "-"
	}
	return inert.Text(u)
}
