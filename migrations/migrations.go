// Package migrations holds intake's schema as numbered SQL files and applies
// them with golang-migrate, which serialises concurrent runs with a
// PostgreSQL advisory lock: several daemons may start at once.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Schema is the schema the migrations put intake's ledger tables in.
const Schema = "public"

// SearchPath is the search_path of every connection intake opens:
// pg_catalog first, then the ledger's schema, and nothing a role's or
// database's default path adds (a "$user" schema). A name the SQL leaves
// unqualified (a ledger table, an unqualified target table) resolves in
// Schema; every built-in function intake calls is written
// pg_catalog-qualified with exactly typed arguments, so a look-alike
// function in Schema is never chosen over it. `intake check` fails when a
// role other than a schema's owner may create in a schema on this path.
const SearchPath = "pg_catalog, " + Schema

// SetSearchPath makes cc's connections use SearchPath, whatever the URL,
// the role or the database set.
func SetSearchPath(cc *pgx.ConnConfig) {
	cc.RuntimeParams["search_path"] = SearchPath
}

//go:embed *.sql
var files embed.FS

// Up applies every migration not yet applied. It is idempotent. It
// refuses a database whose intake tables are in a schema other than
// Schema (created under a path that put another schema first): it would
// otherwise start an empty ledger in Schema beside them.
func Up(dsn string) (version uint, err error) {
	if err := elsewhere(dsn); err != nil {
		return 0, err
	}
	m, err := open(dsn)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return 0, fmt.Errorf("migrate up: %w", err)
	}
	v, dirty, err := m.Version()
	if err != nil {
		return 0, fmt.Errorf("migrate version: %w", err)
	}
	if dirty {
		return v, fmt.Errorf("migrate: version %d is dirty; a migration failed half-way and needs a hand", v)
	}
	return v, nil
}

// Latest is the highest migration version shipped in this binary.
func Latest() (uint, error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return 0, err
	}
	defer src.Close()
	v, err := src.First()
	if err != nil {
		return 0, err
	}
	for {
		next, err := src.Next(v)
		if err != nil {
			return v, nil
		}
		v = next
	}
}

// elsewhere returns an error naming the schemas other than Schema that
// hold intake's migrations table.
func elsewhere(dsn string) error {
	ctx := context.Background()
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	SetSearchPath(cc)
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer c.Close(ctx)
	var other []string
	err = c.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(n.nspname::text ORDER BY n.nspname), '{}')
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'intake_schema_migrations' AND n.nspname <> $1::text`, Schema).Scan(&other)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if len(other) > 0 {
		return fmt.Errorf("migrations: intake's tables are in schema %s, and intake keeps them in %s: move them there (ALTER TABLE … SET SCHEMA %s, each of them) before migrating",
			strings.Join(other, ", "), Schema, Schema)
	}
	return nil
}

func open(dsn string) (*migrate.Migrate, error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	// The migrations create their tables unqualified, in the first schema
	// of the path: Schema alone (pg_catalog, not named, is searched
	// before it, as in SearchPath).
	cc.RuntimeParams["search_path"] = Schema
	db := stdlib.OpenDB(*cc)
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: "intake_schema_migrations", SchemaName: Schema})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return m, nil
}

// Current reports whether the database's schema is the one this binary
// ships, through a query on q (a pool or a connection).
func Current(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	want, err := Latest()
	if err != nil {
		return err
	}
	var have int64
	var dirty bool
	if err := q.QueryRow(ctx, `SELECT version, dirty FROM intake_schema_migrations`).Scan(&have, &dirty); err != nil {
		return fmt.Errorf("schema version: %w (run `intake migrate`)", err)
	}
	if dirty || uint(have) != want {
		return fmt.Errorf("schema at version %d (dirty %v), this binary needs %d: run `intake migrate`", have, dirty, want)
	}
	return nil
}
