package testenv

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/migrations"
)

// Roles are the roles GrantRoles set up for a test's database.
type Roles struct {
	Daemon, Ops, Purge string // login roles but Ops, a group
	url                string
}

// URL is the test database's URL as role.
func (r Roles) URL(role string) string {
	return strings.Replace(r.url, "//postgres@", "//"+role+"@", 1)
}

// DaemonPool is a pool on the test database as the daemon's role, with
// the daemon's search path; closed at the end of the test.
func (r Roles) DaemonPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Pool(t, r.URL(r.Daemon))
}

// Conn is a connection to url with intake's search path
// (migrations.SearchPath); closed at the end of the test.
func Conn(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	migrations.SetSearchPath(cc)
	c, err := pgx.ConnectConfig(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// Pool is a pool on url with intake's search path (migrations.SearchPath),
// as intake's own pools are; closed at the end of the test.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, url, nil)
}

// PoolWith is Pool with set (if not nil) applied to its configuration
// first: a size, a runtime parameter.
func PoolWith(t testing.TB, url string, set func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	migrations.SetSearchPath(pc.ConnConfig)
	if set != nil {
		set(pc)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	ClosePoolAtCleanup(t, pool)
	return pool
}

// GrantRoles creates a daemon's, an ops and a purge role for the test
// database at url (roles are the cluster's: they are named after the
// database, and dropped with the test), and applies what `intake grants`
// prints for them (intake/ledger/grants.sql), then extra (a target
// table's grants, say), as the tables' owner on admin.
func GrantRoles(t testing.TB, url string, admin *pgxpool.Pool, extra string) Roles {
	t.Helper()
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	r := Roles{Daemon: "rd_" + db, Ops: "ro_" + db, Purge: "rp_" + db, url: url}
	if _, err := admin.Exec(ctx, `CREATE ROLE `+r.Daemon+` LOGIN; CREATE ROLE `+r.Ops+` NOLOGIN; CREATE ROLE `+r.Purge+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list := r.Daemon + ", " + r.Ops + ", " + r.Purge
		admin.Exec(context.Background(), "DROP OWNED BY "+list+"; DROP ROLE "+list)
	})
	sql, err := ledger.Grants(ledger.GrantRoles{Database: db, Schema: migrations.Schema, Daemon: r.Daemon, Ops: r.Ops, Purge: r.Purge})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, sql+extra); err != nil {
		t.Fatalf("grants: %v", err)
	}
	return r
}
