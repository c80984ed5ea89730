package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

// The audit's guard (migration 016) holds whatever a role was granted: a
// role given every right on intake_audit (as the daemon's was by the
// earlier install guide) appends rows that record its login role as
// db_user and the transaction's time, whatever it writes there, and
// cannot update, delete or truncate a row; SET ROLE does not change the
// db_user recorded. Retention deletes through intake_purge_audit only,
// for the roles granted EXECUTE: the partner's rows older than the
// cutoff, no other.
func TestAuditIsAppendOnlyAndRecordsTheLoginRole(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	writer, other, purger := "aw_"+db, "ao_"+db, "ap_"+db
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	exec(fmt.Sprintf(`CREATE ROLE %[1]s LOGIN; CREATE ROLE %[2]s NOLOGIN; GRANT %[2]s TO %[1]s; CREATE ROLE %[3]s LOGIN;
		GRANT USAGE ON SCHEMA intake TO %[1]s, %[2]s, %[3]s; GRANT ALL ON intake_audit TO %[1]s, %[2]s;
		GRANT EXECUTE ON FUNCTION intake_purge_audit(text, timestamptz) TO %[3]s`, writer, other, purger))
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s, %[2]s, %[3]s; DROP ROLE %[1]s, %[2]s, %[3]s`, writer, other, purger))
	})
	as := func(role string) string { return strings.Replace(url, "//postgres@", "//"+role+"@", 1) }
	connect := func(role string) *pgx.Conn {
		cc, err := pgx.ParseConfig(as(role))
		if err != nil {
			t.Fatal(err)
		}
		migrations.SetSearchPath(cc)
		c, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	w := connect(writer)
	if _, err := w.Exec(ctx, `INSERT INTO intake_audit (actor, action, partner_id, reason, db_user, at)
		VALUES ('bob', 'release', 'p1', 'forged', 'someone_else', pg_catalog.now() - interval '900 days')`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Exec(ctx, `SET ROLE `+other+`; INSERT INTO intake_audit (actor, action, partner_id, reason) VALUES ('bob', 'discard', 'p1', 'as a group'); RESET ROLE`); err != nil {
		t.Fatal(err)
	}
	got := testenv.Strings(t, admin, `SELECT action || ' ' || db_user || ' ' || (at > pg_catalog.now() - interval '1 hour')::text FROM intake_audit ORDER BY audit_id`)
	if want := []string{"release " + writer + " true", "discard " + writer + " true"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("audit rows %v, want %v: the login role and the time of the insert, whatever the INSERT gave", got, want)
	}
	for _, s := range []string{
		`UPDATE intake_audit SET reason = 'rewritten'`,
		`UPDATE intake_audit SET db_user = 'someone_else'`,
		`DELETE FROM intake_audit`,
		`TRUNCATE intake_audit`,
		`SELECT intake_purge_audit('p1', pg_catalog.now())`,
	} {
		_, err := w.Exec(ctx, s)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("%q by a role granted ALL on intake_audit: %v, want it refused (42501)", s, err)
		}
	}
	if n := testenv.Count(t, admin, `SELECT count(*) FROM intake_audit WHERE reason IN ('forged', 'as a group')`); n != 2 {
		t.Fatalf("%d audit rows left as written, want 2", n)
	}

	// retention: the owner may insert old rows (a restore); the purge
	// role deletes the partner's rows before the cutoff through the
	// ledger, and nothing else
	exec(`INSERT INTO intake_audit (actor, action, partner_id, reason, at) VALUES
		('x', 'old', 'p1', 'old', pg_catalog.now() - interval '500 days'),
		('x', 'old', 'p2', 'old', pg_catalog.now() - interval '500 days')`)
	pc := testenv.Pool(t, as(purger))
	n, err := ledger.New(pc, time.Minute).PurgeAudit(ctx, "p1", time.Now().Add(-400*24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("purge role's PurgeAudit: %d rows, %v; want 1", n, err)
	}
	if got := testenv.Strings(t, admin, `SELECT partner_id || ' ' || reason FROM intake_audit ORDER BY audit_id`); strings.Join(got, ",") != "p1 forged,p1 as a group,p2 old" {
		t.Errorf("audit after the purge: %v, want p1's recent rows and p2's old one", got)
	}
	wp := testenv.Pool(t, as(writer))
	if _, err := ledger.New(wp, time.Minute).PurgeAudit(ctx, "p2", time.Now()); !errors.Is(err, ledger.ErrNotPurgeRole) {
		t.Errorf("PurgeAudit by a role without EXECUTE: %v, want ErrNotPurgeRole", err)
	}
}

// Migration 016 over recorded audit rows: they keep what they said and
// get no db_user (the role that migrates did not write them); rows
// written after it get the writer's. Its down migration gives the table
// back as it was, guard and purge function gone.
func TestAuditMigrationLeavesRecordedRowsWithoutADBUser(t *testing.T) {
	_, admin := testenv.DB(t)
	ctx := context.Background()
	sql := func(name string) string {
		b, err := os.ReadFile("../../migrations/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
	exec(sql("016_audit_append_only.down.sql"))
	if n := testenv.Count(t, admin, `SELECT count(*) FROM pg_catalog.pg_proc WHERE proname IN ('intake_audit_guard', 'intake_purge_audit')`); n != 0 {
		t.Fatalf("%d functions of 016 left after its down migration", n)
	}
	exec(`INSERT INTO intake_audit (actor, action, partner_id, reason) VALUES ('bob', 'release', 'p1', 'before')`)
	exec(`UPDATE intake_audit SET detail = 'changed while it could be'`)
	exec(sql("016_audit_append_only.up.sql"))
	exec(`INSERT INTO intake_audit (actor, action, partner_id, reason) VALUES ('bob', 'release', 'p1', 'after')`)
	got := testenv.Strings(t, admin, `SELECT reason || ' ' || coalesce(db_user, 'NULL') || ' ' || coalesce(detail, '') FROM intake_audit ORDER BY audit_id`)
	if want := "before NULL changed while it could be,after postgres "; strings.Join(got, ",") != want {
		t.Errorf("audit rows %q, want %q", strings.Join(got, ","), want)
	}
	if _, err := admin.Exec(ctx, `UPDATE intake_audit SET detail = 'again'`); err == nil {
		t.Error("an UPDATE of the audit after 016 went through, even for the owner")
	}
}
