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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The SQL `intake grants` prints, applied by the tables' owner, gives each
// role what its job runs and no more, on real PostgreSQL: the daemon's
// role polls (a file lands, conflicts are held), passes intake check
// (which warns for a role that may delete audit rows, and for a
// superuser) and cannot change or delete an audit row, nor purge the
// audit; a person in the ops group reads status and the audit, releases
// a held file, acknowledges a late window, sends a dead webhook delivery
// again and discards a held file (each audited with the person's login
// role beside --actor, and the CLI said who it acts as), and cannot
// rewrite what a file is, add or delete files, write a target table or
// touch an audit row; the purge role purges the audit's old rows and can
// do nothing else asked of it here.
func TestGrantsGiveEachRoleItsJobOnly(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "gr")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	r := grantRoles(t, url, admin, cfg, "alice")
	daemon, person, purge, as := r.daemon, r.people[0], r.purge, r.as
	must := exitZero(t)
	connect := func(role string) *pgx.Conn { return testenv.Conn(t, as(role)) }
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

	// the daemon's role: a file lands, the same batch with other bytes is held
	t.Setenv("INTAKE_DATABASE_URL", as(daemon))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("G", 3))
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("H", 2))
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("I", 2))
	must(runCLI("run", "--config", cfg, "--once"))
	fs := testenv.Files(t, admin, "gr")
	if len(fs) != 3 || fs[0].State != "archived" || fs[0].Applied != 3 || fs[1].State != "quarantined" || fs[2].State != "quarantined" {
		t.Fatalf("files %+v, want the first archived with 3 rows, the others quarantined", fs)
	}
	held, other := strconv.FormatInt(fs[1].ID, 10), strconv.FormatInt(fs[2].ID, 10)
	// check tells the daemon's role is what it should be, and when it is not
	if out := must(runCLI("check", "--config", cfg)); !strings.Contains(out, fmt.Sprintf("ok   database: %q is neither a superuser nor the tables' owner, and may only append to the audit", daemon)) {
		t.Errorf("check as the daemon's role:\n%s", out)
	}
	mustExec(t, admin, `GRANT DELETE ON intake_audit TO `+daemon)
	if out := must(runCLI("check", "--config", cfg)); !strings.Contains(out, fmt.Sprintf("warn database: %q holds UPDATE, DELETE or TRUNCATE on intake_audit", daemon)) {
		t.Errorf("check as a daemon's role that may delete audit rows:\n%s", out)
	}
	mustExec(t, admin, `REVOKE DELETE ON intake_audit FROM `+daemon)
	t.Setenv("INTAKE_DATABASE_URL", url)
	if out := must(runCLI("check", "--config", cfg)); !strings.Contains(out, `warn database: intake connects as "postgres", a superuser`) {
		t.Errorf("check as a superuser:\n%s", out)
	}

	// a person of the ops group: status, a release, the audit
	t.Setenv("INTAKE_DATABASE_URL", as(person))
	if code, out := runCLI("status", "--config", cfg); strings.Contains(out, "permission denied") || !strings.Contains(out, "gr") {
		t.Fatalf("status as the ops role exited %d:\n%s", code, out)
	}
	out := must(runCLI("quarantine", "release", held, "--hold", holdOf(t, admin, held), "--config", cfg, "--reason", "partner confirmed", "--actor", "bob", "--winner", "new"))
	if w := fmt.Sprintf("acting as database user %q, actor \"bob\"\n", person); !strings.Contains(out, w) {
		t.Errorf("release said:\n%s\nwant it to say %q", out, w)
	}
	if got := testenv.Strings(t, admin, `SELECT actor || ' ' || db_user FROM intake_audit WHERE action = 'release' AND intake_id = $1`, fs[1].ID); len(got) != 1 || got[0] != "bob "+person {
		t.Errorf("release audited as %v, want actor bob, db user %s", got, person)
	}
	// acknowledges a late delivery window
	mustExec(t, admin, `INSERT INTO intake_feed_late (partner_id, feed, scheduled_at, deadline, raised_by)
		VALUES ('gr', 'orders', '2026-12-01T06:00:00Z', '2026-12-01T08:00:00Z', 'w')`)
	out = must(runCLI("expect", "ack", "gr/orders", "2026-12-01T06:00:00Z", "--config", cfg, "--reason", "a holiday", "--actor", "bob"))
	if w := fmt.Sprintf("acting as database user %q, actor \"bob\"\n", person); !strings.Contains(out, w) {
		t.Errorf("expect ack said:\n%s\nwant it to say %q", out, w)
	}
	if got := testenv.Strings(t, admin, `SELECT a.db_user || ' ' || l.acked_by FROM intake_audit a, intake_feed_late l WHERE a.action = 'expect_ack' AND l.partner_id = 'gr'`); len(got) != 1 || got[0] != person+" bob" {
		t.Errorf("expect ack audited as %v, want db user %s, acked by bob", got, person)
	}
	// sends a dead webhook delivery again
	var ev int64
	if err := admin.QueryRow(ctx, `WITH e AS (INSERT INTO intake_outbox (partner_id, event, payload, fanned_out) VALUES ('gr', 'quarantined', '{}', true) RETURNING event_id)
		INSERT INTO intake_outbox_delivery (event_id, endpoint_id, state, dead_at) SELECT event_id, 'ops-hook', 'dead', pg_catalog.now() FROM e RETURNING event_id`).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	must(runCLI("notify", "redeliver", "--config", cfg, "--event", strconv.FormatInt(ev, 10), "--reason", "endpoint fixed", "--actor", "bob"))
	if got := testenv.Strings(t, admin, `SELECT d.state || ' ' || a.db_user FROM intake_outbox_delivery d, intake_audit a
		WHERE d.event_id = $1 AND a.action = 'notify_redeliver'`, ev); len(got) != 1 || got[0] != "pending "+person {
		t.Errorf("redelivery %v, want the delivery pending again, audited as %s", got, person)
	}
	// and discards the other conflict: the file closed, its receipt published
	must(runCLI("quarantine", "discard", other, "--hold", holdOf(t, admin, other), "--config", cfg, "--reason", "a stray resend", "--actor", "bob"))
	if got := testenv.Strings(t, admin, `SELECT f.state || ' ' || (f.receipt_path IS NOT NULL AND NOT f.receipt_pending)::text || ' ' || a.db_user FROM file_intake f
		JOIN intake_audit a ON a.intake_id = f.intake_id AND a.action = 'discard' WHERE f.intake_id = $1`, fs[2].ID); len(got) != 1 || got[0] != "discarded true "+person {
		t.Errorf("discarded file %v, want discarded with its receipt, audited as %s", got, person)
	}
	// and replays the landed file: recorded as the person, handed to a
	// daemon, which applies it (every row unchanged) once its reconcile
	// run took it over
	out = must(runCLI("replay", strconv.FormatInt(fs[0].ID, 10), "--config", cfg, "--reason", "target fixed", "--actor", "bob"))
	var replayID int64
	if i := strings.Index(out, "is intake "); i < 0 || !strings.Contains(out, "recorded and handed to a daemon") {
		t.Fatalf("replay as the ops role said:\n%s", out)
	} else {
		fmt.Sscanf(out[i+len("is intake "):], "%d", &replayID)
	}
	if got := testenv.Strings(t, admin, `SELECT f.state || ' ' || a.db_user FROM file_intake f
		JOIN intake_audit a ON a.intake_id = f.intake_id AND a.action = 'replay' WHERE f.replay_of = $1`, fs[0].ID); len(got) != 1 || got[0] != "spooled "+person {
		t.Fatalf("the requested replay %v, want one spooled row audited as %s", got, person)
	}
	t.Setenv("INTAKE_DATABASE_URL", as(daemon))
	runCLI("reconcile", "--config", cfg)
	must(runCLI("run", "--config", cfg, "--once"))
	if got := testenv.Strings(t, admin, `SELECT state || ' ' || rows_unchanged FROM file_intake WHERE intake_id = $1`, replayID); len(got) != 1 || got[0] != "archived 3" {
		t.Fatalf("the replay after the daemon's reconcile and run: %v, want archived with 3 rows unchanged", got)
	}
	t.Setenv("INTAKE_DATABASE_URL", as(person))
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
		// a replay row not audited first
		`INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until, replay_of)
		    VALUES ('gr', 'orders', 'x', 'replay:x', 1, 'spooled', 'w', pg_catalog.now() - interval '1 minute', 1)`,
		`UPDATE intake_audit SET actor = 'someone else'`,
		`DELETE FROM intake_audit`,
		`SELECT intake_purge_audit('gr', pg_catalog.now())`,
		`INSERT INTO public.orders (partner_id, order_id, amount, status, placed_at, last_intake_id) VALUES ('gr', 'X', 1, 'new', pg_catalog.now(), 1)`)

	// Every write of the ops role is audited first (row-level security):
	// a plain UPDATE of a file's state changes nothing, nor does one in a
	// transaction that audited another file; one that audited this file
	// as the same login first changes it.
	changed := func(c *pgx.Conn, sql string, args ...any) int64 {
		t.Helper()
		tag, err := c.Exec(ctx, sql, args...)
		if err != nil {
			t.Fatalf("%q: %v", sql, err)
		}
		return tag.RowsAffected()
	}
	if n := changed(ops, `UPDATE file_intake SET state = 'archived', updated_at = pg_catalog.now() WHERE partner_id = 'gr' AND state <> 'discarded'`); n != 0 {
		t.Fatalf("a plain UPDATE of the ops role changed %d files", n)
	}
	// a discarded file's receipt is the command's to record after its
	// decision, but the file stays discarded
	refused(ops, "the ops role", `UPDATE file_intake SET state = 'archived' WHERE state = 'discarded'`)
	tx, err := ops.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := changed(ops, `INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason) VALUES ('alice', 'test', 'gr', $1, 'why')`, fs[0].ID); n != 1 {
		t.Fatal("the audit row was not appended")
	}
	if n := changed(ops, `UPDATE file_intake SET updated_at = pg_catalog.now() WHERE intake_id = $1`, fs[1].ID); n != 0 {
		t.Fatalf("an UPDATE of a file the transaction did not audit changed %d rows", n)
	}
	if n := changed(ops, `UPDATE file_intake SET updated_at = pg_catalog.now() WHERE intake_id = $1`, fs[0].ID); n != 1 {
		t.Fatalf("an UPDATE of the file the transaction audited changed %d rows, want 1", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Strings(t, admin, `SELECT state FROM file_intake WHERE intake_id = $1`, fs[0].ID); got[0] != "archived" {
		t.Fatalf("file %d is %s", fs[0].ID, got[0])
	}

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
		`UPDATE intake_quarantine SET state = 'discarded'`, // it reads which files are held, no more
		`DELETE FROM intake_quarantine`,
		`SELECT count(*) FROM public.orders`)
}

// With ops.four_eyes, the person who released a file cannot approve its
// plan: another person of the same ops group can. Both act through the
// roles `intake grants` set up, so the approval runs as the ops role too.
func TestFourEyesRefusesTheApprovalOfWhoReleased(t *testing.T) {
	url, admin := testenv.DB(t)
	site := testenv.NewSite(t, "fe")
	cfg := writeConfigOpts(t, site, cfgOpts{feedExtra: "        approval: {always: true}\nops:\n  four_eyes: true\n"})
	r := grantRoles(t, url, admin, cfg, "alice", "bob")
	alice, bob := r.people[0], r.people[1]
	must := exitZero(t)
	planHash := func() (string, string) {
		t.Helper()
		fs := testenv.Files(t, admin, "fe")
		if len(fs) != 1 || fs[0].State != "awaiting_approval" {
			t.Fatalf("files %+v, want one awaiting approval", fs)
		}
		id := strconv.FormatInt(fs[0].ID, 10)
		return id, testenv.Strings(t, admin, `SELECT plan_hash FROM file_intake WHERE intake_id = $1`, fs[0].ID)[0]
	}

	t.Setenv("INTAKE_DATABASE_URL", r.as(r.daemon))
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("F", 3))
	must(runCLI("run", "--config", cfg, "--once"))
	id, _ := planHash()
	// alice rejects the plan; its next run quarantines the file; she releases it
	t.Setenv("INTAKE_DATABASE_URL", r.as(alice))
	must(runCLI("reject", id, "--config", cfg, "--reason", "looks odd", "--actor", "alice"))
	t.Setenv("INTAKE_DATABASE_URL", r.as(r.daemon))
	must(runCLI("run", "--config", cfg, "--once"))
	t.Setenv("INTAKE_DATABASE_URL", r.as(alice))
	must(runCLI("quarantine", "release", id, "--hold", holdOf(t, admin, id), "--config", cfg, "--reason", "partner explained", "--actor", "alice"))
	t.Setenv("INTAKE_DATABASE_URL", r.as(r.daemon))
	// the reconciler takes the released file over, as the daemon's role
	// (exit 1 when a finding needs a human: the exit is not the point)
	if _, out := runCLI("reconcile", "--config", cfg); strings.Contains(out, "SQLSTATE 42501") || strings.Contains(out, "permission denied") {
		t.Fatalf("reconcile as the daemon's role:\n%s", out)
	}
	must(runCLI("run", "--config", cfg, "--once"))
	_, hash := planHash()

	t.Setenv("INTAKE_DATABASE_URL", r.as(alice))
	code, out := runCLI("approve", id, "--config", cfg, "--plan-hash", hash, "--reason", "fine now", "--actor", "someone else")
	if w := "four eyes (ops.four_eyes, or intake grants --four-eyes): database user " + alice + " released it from quarantine"; code != exitRefused || !strings.Contains(out, w) {
		t.Fatalf("approve by who released: exit %d, want 3 and %q:\n%s", code, w, out)
	}
	// the rule is the database's too (intake grants set it from the
	// config): a config without it, or SQL by hand, is refused the same
	lax := writeConfigOpts(t, site, cfgOpts{feedExtra: "        approval: {always: true}\n"})
	code, out = runCLI("approve", id, "--config", lax, "--plan-hash", hash, "--reason", "fine now", "--actor", "alice")
	if w := "four eyes (ops.four_eyes, or intake grants --four-eyes): database user " + alice + " released it from quarantine"; code != exitRefused || !strings.Contains(out, w) {
		t.Fatalf("approve by who released, with a config without four_eyes: exit %d, want 3 and %q:\n%s", code, w, out)
	}
	byHand := testenv.Conn(t, r.as(alice))
	err := pgx.BeginFunc(context.Background(), byHand, func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `INSERT INTO intake_audit (actor, action, partner_id, intake_id, reason)
			VALUES ('alice', 'approve', 'fe', $1::bigint, 'by hand')`, id); err != nil {
			return err
		}
		_, err := tx.Exec(context.Background(), `UPDATE file_intake SET plan_decision = 'approved', approved_plan_hash = plan_hash
			WHERE intake_id = $1::bigint`, id)
		return err
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("an approval by hand by who released: %v, want it refused by row-level security (42501)", err)
	}

	t.Setenv("INTAKE_DATABASE_URL", r.as(bob))
	must(runCLI("approve", id, "--config", lax, "--plan-hash", hash, "--reason", "fine now", "--actor", "bob"))
	if got := testenv.Strings(t, admin, `SELECT action || ' ' || db_user FROM intake_audit WHERE intake_id = $1 AND action IN ('reject', 'release', 'approve') ORDER BY audit_id`, id); strings.Join(got, ",") != "reject "+alice+",release "+alice+",approve "+bob {
		t.Errorf("audit %v, want alice's reject and release, bob's approval", got)
	}
	t.Setenv("INTAKE_DATABASE_URL", r.as(r.daemon))
	must(runCLI("run", "--config", cfg, "--once"))
	if fs := testenv.Files(t, admin, "fe"); fs[0].State != "archived" || fs[0].Applied != 3 {
		t.Errorf("approved file %+v, want archived with 3 rows", fs[0])
	}
}

// exitZero is a test's check that a command exited 0, returning its
// output.
func exitZero(t *testing.T) func(int, string) string {
	return func(code int, out string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		return out
	}
}

// roles are what grantRoles set up: the daemon's, the ops group with
// people in it, the purge role (login roles but the group), and the URL
// of the test's database as one of them.
type roles struct {
	daemon, ops, purge string
	people             []string
	as                 func(role string) string
}

// grantRoles creates the roles of a test (named after its database:
// roles are the cluster's) and applies what `intake grants --config cfg`
// prints for them, as the tables' owner.
func grantRoles(t *testing.T, url string, admin *pgxpool.Pool, cfg string, people ...string) roles {
	t.Helper()
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	r := roles{daemon: "gd_" + db, ops: "go_" + db, purge: "gp_" + db,
		as: func(role string) string { return strings.Replace(url, "//postgres@", "//"+role+"@", 1) }}
	create := fmt.Sprintf(`CREATE ROLE %s LOGIN; CREATE ROLE %s NOLOGIN; CREATE ROLE %s LOGIN;`, r.daemon, r.ops, r.purge)
	all := []string{r.daemon, r.ops, r.purge}
	for _, p := range people {
		r.people = append(r.people, p+"_"+db)
		create += fmt.Sprintf(` CREATE ROLE %s LOGIN IN ROLE %s;`, p+"_"+db, r.ops)
		all = append([]string{p + "_" + db}, all...)
	}
	mustExec(t, admin, create)
	t.Cleanup(func() {
		list := strings.Join(all, ", ")
		admin.Exec(context.Background(), "DROP OWNED BY "+list+"; DROP ROLE "+list)
	})
	t.Setenv("INTAKE_DATABASE_URL", url)
	code, sql := runCLI("grants", "--config", cfg, "--daemon-role", r.daemon, "--ops-role", r.ops, "--purge-role", r.purge)
	if code != 0 {
		t.Fatalf("grants: exit %d\n%s", code, sql)
	}
	if !strings.Contains(sql, `GRANT SELECT, INSERT, UPDATE ON "public"."orders" TO "`+r.daemon+`";`) {
		t.Fatalf("grants lack the feed's target table:\n%s", sql)
	}
	mustExec(t, admin, sql)
	return r
}

func mustExec(t *testing.T, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
}
