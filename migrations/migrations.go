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

// Schema is the schema the migrations put intake's ledger tables in: a
// schema of intake's own, owned by the role that migrates, where no other
// role may create (a new schema grants CREATE to nobody else).
const Schema = "intake"

// formerSchema is where releases before Schema existed kept the ledger:
// Up moves it from there (relocate).
const formerSchema = "public"

// SearchPath is the search_path of every connection intake opens:
// pg_catalog first, then the ledger's schema, then public, and nothing a
// role's or database's default path adds (a "$user" schema). A ledger
// table left unqualified resolves in Schema, ahead of anything of the
// same name in public; every built-in function intake calls is written
// pg_catalog-qualified with exactly typed arguments. public stays on the
// path for the operators and types of extensions installed there (a
// citext key's =, hstore's), which the statements on a target use; a
// target table itself is always named schema-qualified (an unqualified
// target is public's: names.SplitTarget). `intake check` fails when a
// role other than a schema's owner may create in a schema on this path.
const SearchPath = "pg_catalog, " + Schema + ", public"

// SetSearchPath makes cc's connections use SearchPath, whatever the URL,
// the role or the database set.
func SetSearchPath(cc *pgx.ConnConfig) {
	cc.RuntimeParams["search_path"] = SearchPath
}

//go:embed *.sql
var files embed.FS

// Up applies every migration not yet applied. It is idempotent. It first
// makes Schema, and moves a ledger an earlier release kept in public into
// it (relocate); it refuses a database whose intake tables are in any
// other schema (created under a path that put another schema first): it
// would otherwise start an empty ledger in Schema beside them.
func Up(dsn string) (version uint, err error) {
	if err := prepare(dsn); err != nil {
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

// ledgerRelations are the tables and functions the migrations made
// before Schema existed, which relocate moves from formerSchema. A table
// takes its indexes, constraints, triggers, policies, grants and owned
// sequences with it.
var (
	ledgerTables = []string{"intake_schema_migrations", "file_intake", "intake_batch", "intake_chunk",
		"intake_row_issue", "intake_worker", "intake_partner_poll", "intake_finding", "intake_reconcile_run",
		"intake_quarantine", "intake_audit", "intake_snapshot_key", "intake_site_profile", "intake_feed_expect",
		"intake_feed_late", "intake_outbox", "intake_outbox_delivery", "intake_ready_seen", "intake_record_claim"}
	ledgerFunctions = []string{"intake_audit_guard()", "intake_purge_audit(text, timestamptz)"}
)

// prepare makes Schema and moves a ledger kept in formerSchema into it,
// in one transaction under an advisory lock (several daemons may start at
// once), before golang-migrate looks for its table in Schema. It refuses
// intake's tables in any other schema.
func prepare(dsn string) error {
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
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('intake migrations: schema'::text, 0::int8))`); err != nil {
			return err
		}
		var where []string
		err := tx.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(n.nspname::text ORDER BY n.nspname), '{}')
			FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relname = 'intake_schema_migrations'`).Scan(&where)
		if err != nil {
			return err
		}
		// the ledger of an earlier release, alone in formerSchema, is moved;
		// intake's tables in any other schema, or in two, are refused
		former := len(where) == 1 && where[0] == formerSchema
		var other []string
		for _, s := range where {
			if s != Schema {
				other = append(other, s)
			}
		}
		if len(other) > 0 && !former {
			return fmt.Errorf("intake's tables are in schema %s, and intake keeps them in %s: move them there (ALTER TABLE … SET SCHEMA %s, each of them) before migrating",
				strings.Join(other, ", "), Schema, Schema)
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+Schema); err != nil {
			return err
		}
		if former {
			return relocate(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

// relocate moves the ledger from formerSchema into Schema, in tx. Every
// role granted a right on file_intake there is granted USAGE on Schema,
// so a deployment's roles keep working across the move (`intake grants`
// grants the same). intake_purge_audit runs with the search_path it was
// made with: it is set to Schema.
func relocate(ctx context.Context, tx pgx.Tx) error {
	var grantees []string
	err := tx.QueryRow(ctx, `SELECT coalesce(pg_catalog.array_agg(DISTINCT a.grantee::pg_catalog.regrole::text), '{}')
		FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
		WHERE c.oid = pg_catalog.to_regclass($1::text) AND a.grantee <> 0 AND a.grantee <> c.relowner`,
		formerSchema+".file_intake").Scan(&grantees)
	if err != nil {
		return err
	}
	for _, t := range ledgerTables {
		if _, err := tx.Exec(ctx, `ALTER TABLE IF EXISTS `+formerSchema+`.`+t+` SET SCHEMA `+Schema); err != nil {
			return fmt.Errorf("moving %s into %s: %w", t, Schema, err)
		}
	}
	for _, f := range ledgerFunctions {
		var found bool
		if err := tx.QueryRow(ctx, `SELECT pg_catalog.to_regprocedure($1::text) IS NOT NULL`, formerSchema+"."+f).Scan(&found); err != nil {
			return err
		}
		if found {
			if _, err := tx.Exec(ctx, `ALTER FUNCTION `+formerSchema+`.`+f+` SET SCHEMA `+Schema); err != nil {
				return fmt.Errorf("moving %s into %s: %w", f, Schema, err)
			}
		}
	}
	var purge bool
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.to_regprocedure($1::text) IS NOT NULL`, Schema+".intake_purge_audit(text, timestamptz)").Scan(&purge); err != nil {
		return err
	}
	if purge {
		if _, err := tx.Exec(ctx, `ALTER FUNCTION `+Schema+`.intake_purge_audit(text, timestamptz) SET search_path = `+Schema); err != nil {
			return err
		}
	}
	for _, g := range grantees {
		// g is regrole's output: an identifier, quoted where it needs to be
		if _, err := tx.Exec(ctx, `GRANT USAGE ON SCHEMA `+Schema+` TO `+g); err != nil {
			return fmt.Errorf("granting USAGE on %s to %s: %w", Schema, g, err)
		}
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
	// before it, as in SearchPath). prepare has made it.
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
