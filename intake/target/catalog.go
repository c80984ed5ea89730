package target

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/names"
)

// catalogColumn is one column of a target table as the catalog describes
// it. A domain is described by its base type (one level), with the
// domain's NOT NULL and default folded in.
type catalogColumn struct {
	name     string
	typ      string // format_type, as written in the table's DDL
	oid      uint32 // the column's own type (a domain's oid for a domain)
	base     uint32 // the base type of a domain, else oid
	baseName string // pg_type.typname of base: varchar, bpchar, int4, ...
	typmod   int32  // of base: varchar(n) has n+4, numeric(p,s) has (p<<16|s)+4
	category string // pg_type.typcategory of base: S string, N numeric, ...
	enum     bool   // base is an enum type
	domain   string // the domain's name, "" when the type is no domain
	notNull  bool
	// hasDefault: an omitted value is filled (a default, identity or
	// generated column).
	hasDefault bool
	generated  bool // GENERATED ALWAYS AS (...) STORED: never written
	identity   bool // GENERATED ALWAYS AS IDENTITY: written only with OVERRIDING
	// collation: the column's own collation, schema-qualified and quoted,
	// when it is not the database's default ("" else); deterministic:
	// values that compare equal under it are the same bytes (a
	// nondeterministic one, an ICU level-2 say, makes 'X-1' and 'x-1' one
	// key).
	collation     string
	deterministic bool
}

// targetIdent is a configured target's schema and name.
func targetIdent(table string) pgx.Identifier {
	schema, name := names.SplitTarget(table)
	return pgx.Identifier{schema, name}
}

// catalogTable is a target table as the catalog describes it.
type catalogTable struct {
	oid   uint32
	ident pgx.Identifier
	cols  map[string]*catalogColumn
	order []string // column names in table order
}

// describe reads a target table's columns from the catalog. The table is
// looked up by its schema and name (an unqualified name is public's:
// names.SplitTarget), and the statements name it so, quoted.
func describe(ctx context.Context, db *pgxpool.Pool, table string) (*catalogTable, error) {
	var oid uint32
	var schema, name string
	err := db.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = pg_catalog.to_regclass($1)`, targetIdent(table).Sanitize()).Scan(&oid, &schema, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &Error{Table: table, Detail: "does not exist (create it; see docs/target-tables.md)"}
	}
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", table, err)
	}
	ident := pgx.Identifier{schema, name}
	rs, err := db.Query(ctx, `SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.atttypid, b.oid, b.typname,
		    CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END, b.typcategory::text, b.typtype = 'e',
		    CASE WHEN t.typtype = 'd' THEN pg_catalog.format_type(a.atttypid, NULL) ELSE '' END,
		    a.attnotnull OR (t.typtype = 'd' AND t.typnotnull),
		    a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' OR (t.typtype = 'd' AND t.typdefault IS NOT NULL),
		    a.attgenerated <> '', a.attidentity = 'a',
		    CASE WHEN a.attcollation NOT IN (0, 100) THEN pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname) ELSE '' END,
		    coalesce(c.collisdeterministic, true)
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END
		LEFT JOIN pg_collation c ON c.oid = a.attcollation
		LEFT JOIN pg_namespace n ON n.oid = c.collnamespace
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", table, err)
	}
	tt := &catalogTable{oid: oid, ident: ident, cols: map[string]*catalogColumn{}}
	for rs.Next() {
		c := &catalogColumn{}
		if err := rs.Scan(&c.name, &c.typ, &c.oid, &c.base, &c.baseName, &c.typmod, &c.category, &c.enum,
			&c.domain, &c.notNull, &c.hasDefault, &c.generated, &c.identity, &c.collation, &c.deterministic); err != nil {
			return nil, fmt.Errorf("target %s: %w", table, err)
		}
		tt.cols[c.name] = c
		tt.order = append(tt.order, c.name)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("target %s: %w", table, err)
	}
	return tt, nil
}
