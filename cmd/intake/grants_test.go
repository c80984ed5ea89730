package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The SQL `intake grants` prints, applied by the tables' owner, gives each
// role what its job runs and no more, on real PostgreSQL: the daemon's
// role polls (a file lands, a conflict is held) and cannot change or
// delete an audit row, nor purge the audit; a person in the ops group
// reads status and the audit, releases the held file (the audit records
// the person's login role beside --actor, and the CLI said who it acts
// as), and cannot rewrite what a file is, add or delete files, or touch
// an audit row; the purge role purges the audit's old rows and can do
// nothing else asked of it here.
func TestGrantsGiveEachRoleItsJobOnly(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// roles are the cluster's: named after this test's database
	daemon, opsGroup, person, purge := "gd_"+db, "go_"+db, "alice_"+db, "gp_"+db
	mustExec(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN; CREATE ROLE %s NOLOGIN; CREATE ROLE %s LOGIN IN ROLE %s; CREATE ROLE %s LOGIN`,
		daemon, opsGroup, person, opsGroup, purge))
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s, %[2]s, %[3]s, %[4]s; DROP ROLE %[3]s, %[1]s, %[2]s, %[4]s`,
			daemon, opsGroup, person, purge))
	})
	as := func(role string) string { return strings.Replace(url, "//postgres@", "//"+role+"@", 1) }
	connect := func(role string) *pgx.Conn {
		c, err := pgx.Connect(ctx, as(role))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	must := func(code int, out string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		return out
	}
	// refused: each statement fails with insufficient_privilege (42501),
	// from the grants or the audit's guard
	refused := func(c *pgx.Conn, who string, stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			_, err := c.Exec(ctx, s)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42501" {
				t.Errorf("%s ran %q: %v, want it refused (42501)", who, s, err)
			}
		}
	}

	site := testenv.NewSite(t, "gr")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	t.Setenv("INTAKE_DATABASE_URL", url)
	sql := must(runCLI("grants", "--config", cfg, "--daemon-role", daemon, "--ops-role", opsGroup, "--purge-role", purge))
	if !strings.Contains(sql, `GRANT SELECT, INSERT, UPDATE ON "public"."orders" TO "`+daemon+`";`) {
		t.Fatalf("grants lack the feed's target table:\n%s", sql)
	}
	mustExec(t, admin, sql)

	// the daemon's role: a file lands, the same batch with other bytes is held
	t.Setenv("INTAKE_DATABASE_URL", as(daemon))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("G", 3))
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("H", 2))
	must(runCLI("run", "--config", cfg, "--once"))
	fs := testenv.Files(t, admin, "gr")
	if len(fs) != 2 || fs[0].State != "archived" || fs[0].Applied != 3 || fs[1].State != "quarantined" {
		t.Fatalf("files %+v, want the first archived with 3 rows, the second quarantined", fs)
	}
	held := strconv.FormatInt(fs[1].ID, 10)

	// a person of the ops group: status, a release, the audit
	t.Setenv("INTAKE_DATABASE_URL", as(person))
	if code, out := runCLI("status", "--config", cfg); strings.Contains(out, "permission denied") || !strings.Contains(out, "gr") {
		t.Fatalf("status as the ops role exited %d:\n%s", code, out)
	}
	out := must(runCLI("quarantine", "release", held, "--config", cfg, "--reason", "partner confirmed", "--actor", "bob", "--winner", "new"))
	if w := fmt.Sprintf("acting as database user %q, actor \"bob\"\n", person); !strings.HasPrefix(out, w) {
		t.Errorf("release said:\n%s\nwant it to start with %q", out, w)
	}
	if got := testenv.Strings(t, admin, `SELECT actor || ' ' || db_user FROM intake_audit WHERE action = 'release' AND intake_id = $1`, fs[1].ID); len(got) != 1 || got[0] != "bob "+person {
		t.Errorf("release audited as %v, want actor bob, db user %s", got, person)
	}
	if out := must(runCLI("audit", "--config", cfg)); !strings.Contains(out, "DB USER") || !strings.Contains(out, person) {
		t.Errorf("intake audit does not show the db user:\n%s", out)
	}
	ops := connect(person)
	refused(ops, "the ops role",
		`UPDATE file_intake SET content_sha256 = 'forged'`,
		`UPDATE file_intake SET partner_id = 'other', batch_id = 'other'`,
		`UPDATE file_intake SET rows_total = 0`,
		`DELETE FROM file_intake`,
		`INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		    VALUES ('gr', 'orders', 'x', 'x', 1, 'archived', 'w', pg_catalog.now())`,
		`UPDATE intake_audit SET actor = 'someone else'`,
		`DELETE FROM intake_audit`,
		`SELECT intake_purge_audit('gr', pg_catalog.now())`,
		`INSERT INTO orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('gr', 'X', 1, 'new', pg_catalog.now(), 1)`)

	// the daemon's role cannot change or delete the audit row, nor purge it
	dc := connect(daemon)
	refused(dc, "the daemon's role",
		`UPDATE intake_audit SET reason = 'rewritten'`,
		`DELETE FROM intake_audit`,
		`TRUNCATE intake_audit`,
		`SELECT intake_purge_audit('gr', pg_catalog.now())`)
	mustExec(t, admin, `INSERT INTO intake_audit (actor, action, partner_id, reason, at) VALUES ('x', 'test', 'gr', 'old', pg_catalog.now() - interval '500 days')`)
	t.Setenv("INTAKE_DATABASE_URL", as(daemon))
	if out := must(runCLI("purge", "--config", cfg)); !strings.Contains(out, "no audit entries (this database role may not purge the audit") {
		t.Errorf("purge as the daemon's role said:\n%s", out)
	}
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_audit WHERE reason = 'old'`); n != 1 {
		t.Fatalf("%d old audit rows after the daemon's purge, want 1 (kept)", n)
	}

	// the purge role: the old audit row goes, the decisions stay
	t.Setenv("INTAKE_DATABASE_URL", as(purge))
	if out := must(runCLI("purge", "--config", cfg)); !strings.Contains(out, "1 audit entries removed") {
		t.Errorf("purge as the purge role said:\n%s", out)
	}
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_audit WHERE reason = 'old'`); n != 0 {
		t.Errorf("%d old audit rows after the purge role's purge, want 0", n)
	}
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_audit WHERE action = 'release'`); n != 1 {
		t.Errorf("%d release rows after the purge, want 1", n)
	}
	pc := connect(purge)
	refused(pc, "the purge role",
		`DELETE FROM intake_audit`,
		`UPDATE intake_audit SET reason = 'x'`,
		`INSERT INTO intake_audit (actor, action, partner_id, reason) VALUES ('x', 'x', 'gr', 'x')`,
		`UPDATE file_intake SET state = 'discarded'`,
		`DELETE FROM file_intake`,
		`SELECT count(*) FROM intake_quarantine`,
		`SELECT count(*) FROM orders`)
}

func mustExec(t *testing.T, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
}
