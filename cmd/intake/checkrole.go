package main

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
)

// roleWarnings tells whether the role `intake check` connects as (the
// daemon's, with the daemon's config) holds more than the daemon's job on
// the audit: a superuser or the tables' owner (or a member of it) can
// disable the audit's guard and delete its rows; a right to UPDATE,
// DELETE or TRUNCATE it or to run intake_purge_audit is another role's
// (install.md, "PostgreSQL: roles and grants"). Warnings, not failures:
// intake runs all the same.
func roleWarnings(ctx context.Context, pool *pgxpool.Pool, stdout io.Writer) error {
	var user, owner string
	var super, owns, writes, purges bool
	err := pool.QueryRow(ctx, `SELECT session_user::text, pg_catalog.pg_get_userbyid(c.relowner)::text, r.rolsuper,
		    pg_catalog.pg_has_role(session_user, c.relowner, 'USAGE'),
		    pg_catalog.has_table_privilege(c.oid, 'UPDATE') OR pg_catalog.has_table_privilege(c.oid, 'DELETE')
		        OR pg_catalog.has_table_privilege(c.oid, 'TRUNCATE'),
		    pg_catalog.has_function_privilege('intake_purge_audit(text, timestamptz)', 'EXECUTE')
		FROM pg_catalog.pg_class c, pg_catalog.pg_roles r
		WHERE c.oid = 'intake_audit'::regclass AND r.rolname = session_user`).Scan(&user, &owner, &super, &owns, &writes, &purges)
	if err != nil {
		return err
	}
	switch {
	case super:
		fmt.Fprintf(stdout, "warn database: intake connects as %q, a superuser: it can disable the audit's guard and rewrite or erase the audit, and so can any function a target table makes it run; connect as the daemon's role of intake grants (docs/install.md)\n", user)
	case owns:
		fmt.Fprintf(stdout, "warn database: intake connects as %q, which owns intake's tables (owner %q): it can disable the audit's guard and erase audit rows; migrate as the owner, run as the daemon's role of intake grants (docs/install.md)\n", user, owner)
	default:
		if writes {
			fmt.Fprintf(stdout, "warn database: %q holds UPDATE, DELETE or TRUNCATE on intake_audit, which no job of the daemon needs (the audit's guard refuses them): REVOKE UPDATE, DELETE, TRUNCATE ON intake_audit FROM the role\n", user)
		}
		if purges {
			fmt.Fprintf(stdout, "warn database: %q may run intake_purge_audit, the purge role's job: REVOKE EXECUTE ON FUNCTION intake_purge_audit(text, timestamptz) FROM the role\n", user)
		}
		if !writes && !purges {
			fmt.Fprintf(stdout, "ok   database: %q is neither a superuser nor the tables' owner, and may only append to the audit\n", user)
		}
	}
	return nil
}
