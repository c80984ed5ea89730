// Package migrations holds intake's schema as numbered SQL files and applies
// them with golang-migrate, which serialises concurrent runs with a
// PostgreSQL advisory lock: several daemons may start at once.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

//go:embed *.sql
var files embed.FS

// Up applies every migration not yet applied. It is idempotent.
func Up(dsn string) (version uint, err error) {
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

func open(dsn string) (*migrate.Migrate, error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: "intake_schema_migrations"})
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
