// Package target is what intake knows of a partner's target table: the
// catalog's description of it (describe), the check that a feed can be
// written into it (Load, Check) and the comparison of each feed column with
// its target column (Compare), the statements that write a chunk into it
// (COPY straight in, or staged, deduplicated and merged: write.go), and the
// COPY binary encoders of the values (binary.go). The pipeline in package
// intake gets a *Table from a Cache and calls its methods on its own
// transaction; it sees no SQL of the target's.
package target

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/partners"
)

// Table is a feed's target table as the database describes it, with the
// statements that merge a staged chunk into it.
type Table struct {
	table string   // quoted, possibly schema-qualified
	cols  []string // feed columns in file order
	types []string // their types in the target, for casts from staged text
	key   []string
	merge string // merge from the staging table; returns (applied, conflict, new)
	// rangeProbe: the unique index leads with (partner_id, first key
	// column), so merge reads the chunk's key range in one index scan
	// when that range is dense (see build).
	rangeProbe bool
	dedupe     string // drops earlier lines that repeat a key within the chunk
	// stage is the staging table: a temporary table per connection, kept
	// and emptied at each commit, named after the feed's column list.
	stage      string
	stageDDL   string
	stageCopy  string // COPY into the staging table: line, columns
	directCopy string // COPY into the target: partner_id, columns, last_intake_id
	// binary: chunks travel in COPY's binary format, each column through
	// enc (see binaryEncoder); the staging table then has the target's
	// types. Otherwise COPY text into text columns, cast by the merge.
	binary bool
	enc    []Encoder // per column; nil where the pair has no binary encoder
}

// Error says what is wrong with a target table, and how to fix it.
type Error struct {
	Table  string
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("target table %s: %s", e.Table, e.Detail) }

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
}

// catalogTable is a target table as the catalog describes it.
type catalogTable struct {
	oid   uint32
	ident pgx.Identifier
	cols  map[string]*catalogColumn
	order []string // column names in table order
}

// describe reads a target table's columns from the catalog.
func describe(ctx context.Context, db *pgxpool.Pool, table string) (*catalogTable, error) {
	ident := pgx.Identifier(strings.Split(table, "."))
	var oid uint32
	err := db.QueryRow(ctx, `SELECT coalesce(to_regclass($1)::oid, 0)`, ident.Sanitize()).Scan(&oid)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", table, err)
	}
	if oid == 0 {
		return nil, &Error{Table: table, Detail: "does not exist (create it; see docs/target-tables.md)"}
	}
	rs, err := db.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, b.oid, b.typname,
		    CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END, b.typcategory::text, b.typtype = 'e',
		    CASE WHEN t.typtype = 'd' THEN format_type(a.atttypid, NULL) ELSE '' END,
		    a.attnotnull OR (t.typtype = 'd' AND t.typnotnull),
		    a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '' OR (t.typtype = 'd' AND t.typdefault IS NOT NULL),
		    a.attgenerated <> '', a.attidentity = 'a'
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", table, err)
	}
	tt := &catalogTable{oid: oid, ident: ident, cols: map[string]*catalogColumn{}}
	for rs.Next() {
		c := &catalogColumn{}
		if err := rs.Scan(&c.name, &c.typ, &c.oid, &c.base, &c.baseName, &c.typmod, &c.category, &c.enum,
			&c.domain, &c.notNull, &c.hasDefault, &c.generated, &c.identity); err != nil {
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

// mappingKey identifies what a target is built from: the table, the feed's
// columns in file order with their types, and the key. Feeds with the same
// mapping share one target (the partner id is a parameter of every
// statement); any difference, such as another partner's column order under
// the same feed name, gets its own. It is the mapping itself, not a hash
// of it, so two mappings never share an entry.
func mappingKey(f *partners.Feed) string {
	var b strings.Builder
	b.WriteString(f.Target)
	for _, c := range f.Columns {
		b.WriteString("\x00" + c.Name + "\x01" + c.Type)
	}
	b.WriteString("\x00\x02key")
	for _, k := range f.Key {
		b.WriteString("\x00" + k)
	}
	return b.String()
}

// Load reads the target's columns and unique indexes and checks them
// against the feed: intake needs partner_id, every feed column,
// last_intake_id bigint, and a unique index on exactly (partner_id, key...).
// What it reads of the feed is what mappingKey holds.
func Load(ctx context.Context, db *pgxpool.Pool, f *partners.Feed) (*Table, error) {
	tt, err := describe(ctx, db, f.Target)
	if err != nil {
		return nil, err
	}
	ident, oid := tt.ident, tt.oid
	types := map[string]string{}
	oids := map[string]uint32{}
	for n, c := range tt.cols {
		types[n], oids[n] = c.typ, c.oid
	}
	t := &Table{table: ident.Sanitize(), key: f.Key}
	if types["partner_id"] == "" {
		return nil, &Error{Table: f.Target, Detail: "missing column partner_id (text)"}
	}
	if types["last_intake_id"] != "bigint" {
		return nil, &Error{Table: f.Target, Detail: "missing column last_intake_id bigint (intake's bookkeeping)"}
	}
	for _, c := range f.Columns {
		typ, ok := types[c.Name]
		if !ok {
			return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("missing column %s declared by feed %s", c.Name, f.Name)}
		}
		t.cols = append(t.cols, c.Name)
		t.types = append(t.types, typ)
		t.enc = append(t.enc, binaryEncoder(c.Type, oids[c.Name]))
	}
	// COPY binary when every column has an encoder and partner_id is text
	t.binary = oids["partner_id"] == oidText || oids["partner_id"] == oidVarchar
	for _, e := range t.enc {
		t.binary = t.binary && e != nil
	}

	// found: a unique index on exactly (partner_id, key...); leading: one
	// of them starts with (partner_id, first key column), so a chunk's
	// key range is one index range scan.
	var found, leading bool
	err = db.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(
		    (SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum = i.indkey[0]) = 'partner_id'
		    AND (SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum = i.indkey[1]) = $3), false)
		FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
		  AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
		       WHERE a.attrelid = $1 AND a.attnum = ANY(i.indkey)) = (SELECT array_agg(x ORDER BY x) FROM unnest($2::text[]) x)
		  AND cardinality(i.indkey::int2[]) = cardinality($2::text[])`,
		oid, append([]string{"partner_id"}, f.Key...), f.Key[0]).Scan(&found, &leading)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", f.Target, err)
	}
	if !found {
		return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("needs a unique index on exactly (partner_id, %s)", strings.Join(f.Key, ", "))}
	}
	t.rangeProbe = leading
	t.build()
	return t, nil
}

// build writes the chunk statements. merge: $1 = the writer id rows are
// written and judged by (a replay writes as the intake it replays, so it
// never overwrites what a newer intake wrote), $2 = partner id, $3 = the
// intake the row issues belong to. dedupe: $1 = intake id, $2 = partner id.
// the staging table holds (line, <cols>), as text or (binary) already in
// the target's types; the casts turn text into those types.
func (t *Table) build() {
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	sig := fnv.New64a()
	stageCols := []string{"line bigint NOT NULL"}
	var quoted []string
	for i, c := range t.cols {
		typ := "text"
		if t.binary {
			typ = t.types[i]
		}
		fmt.Fprintf(sig, "%s\x00%s\x00", c, typ)
		stageCols = append(stageCols, q(c)+" "+typ)
		quoted = append(quoted, q(c))
	}
	t.stage = fmt.Sprintf("intake_stage_%016x", sig.Sum64())
	format := ""
	if t.binary {
		format = " WITH (FORMAT binary)"
	}
	t.stageDDL = fmt.Sprintf("CREATE TEMP TABLE IF NOT EXISTS %s (%s) ON COMMIT DELETE ROWS", t.stage, strings.Join(stageCols, ", "))
	t.stageCopy = fmt.Sprintf("COPY %s (line, %s) FROM STDIN%s", t.stage, strings.Join(quoted, ", "), format)
	t.directCopy = fmt.Sprintf("COPY %s (partner_id, %s, last_intake_id) FROM STDIN%s", t.table, strings.Join(quoted, ", "), format)
	cast := func(alias string, i int) string {
		return fmt.Sprintf("%s.%s::%s", alias, q(t.cols[i]), t.types[i])
	}
	var insCols, selCols, setCols, tgtVals, excVals, stageVals, keyStage, keyJoin []string
	for i, c := range t.cols {
		insCols = append(insCols, q(c))
		selCols = append(selCols, cast("s", i))
		if slices.Contains(t.key, c) {
			keyStage = append(keyStage, cast("s", i))
			keyJoin = append(keyJoin, fmt.Sprintf("t.%s = %s", q(c), cast("s", i)))
			continue
		}
		setCols = append(setCols, fmt.Sprintf("%s = EXCLUDED.%s", q(c), q(c)))
		tgtVals = append(tgtVals, "t."+q(c))
		excVals = append(excVals, "EXCLUDED."+q(c))
		stageVals = append(stageVals, cast("s", i))
	}
	conflictCols := []string{"partner_id"}
	for _, k := range t.key {
		conflictCols = append(conflictCols, q(k))
	}
	// A feed whose every column is a key has nothing to update: a matching
	// row is unchanged by definition.
	distinct, doUpdate := "false", "DO NOTHING"
	if len(setCols) > 0 {
		distinct = fmt.Sprintf("ROW(%s) IS DISTINCT FROM ROW(%s)", strings.Join(tgtVals, ", "), strings.Join(excVals, ", "))
		doUpdate = fmt.Sprintf(`DO UPDATE SET %s, last_intake_id = EXCLUDED.last_intake_id
		    WHERE %s AND t.last_intake_id <= EXCLUDED.last_intake_id`, strings.Join(setCols, ", "), distinct)
	}
	// One statement per chunk: cast the staged text once, look every row
	// up in the target by its key (a LATERAL probe of the unique index: a
	// plain join may hash the whole, growing target per chunk), insert or update only rows that are new or changed
	// and not written by a newer intake (unchanged rows never reach ON
	// CONFLICT, so they are neither locked nor rewritten), and record rows
	// a newer intake holds as conflicts. The ON CONFLICT guard repeats the
	// condition, so a writer racing between the lookup and the insert is
	// still never overwritten (such a row is then counted unchanged).
	var sCols, jCols []string
	for i, c := range t.cols {
		sCols = append(sCols, fmt.Sprintf("%s AS %s", cast("st", i), q(c)))
		jCols = append(jCols, "j."+q(c))
	}
	var sKeyJoin, sNonKey []string
	for _, c := range t.cols {
		if slices.Contains(t.key, c) {
			sKeyJoin = append(sKeyJoin, fmt.Sprintf("t.%s = s.%s", q(c), q(c)))
		} else {
			sNonKey = append(sNonKey, "s."+q(c))
		}
	}
	differs := "false"
	if len(setCols) > 0 {
		differs = fmt.Sprintf("ROW(%s) IS DISTINCT FROM ROW(%s)", strings.Join(tgtVals, ", "), strings.Join(sNonKey, ", "))
	}
	// How each staged row meets its target row. By default a LATERAL
	// probe of the unique index per row (a plain join may hash the whole,
	// growing target). When the index leads with (partner_id, first key
	// column), the chunk's key range is read in one index range scan and
	// hashed instead; that read is capped at $4 rows (rangeCapFactor per
	// staged row), and a sparse chunk whose range holds more is probed row
	// by row, decided at run time within the statement.
	// j keeps only rows that need something (new, or differing: written or
	// a conflict): unchanged rows, all of a replay, are never materialised.
	probe := fmt.Sprintf(`j AS (
		    SELECT s.*, t.last_intake_id AS intake_t_last, t.partner_id IS NULL AS intake_is_new, %[1]s AS intake_differs
		    FROM s LEFT JOIN LATERAL (
		        SELECT * FROM %[2]s t WHERE t.partner_id = $2 AND %[3]s LIMIT 1) t ON true
		    WHERE t.partner_id IS NULL OR %[1]s)`,
		differs, t.table, strings.Join(sKeyJoin, " AND "))
	if t.rangeProbe {
		probe = fmt.Sprintf(`r AS MATERIALIZED (
		    SELECT t.* FROM %[1]s t
		    WHERE t.partner_id = $2 AND t.%[2]s BETWEEN (SELECT min(%[2]s) FROM s) AND (SELECT max(%[2]s) FROM s)
		    ORDER BY t.partner_id, t.%[2]s LIMIT $4),
		dense AS (SELECT count(*) < $4 AS ok FROM r),
		j AS (
		    SELECT s.*, t.last_intake_id AS intake_t_last, t.partner_id IS NULL AS intake_is_new, %[3]s AS intake_differs
		    FROM s LEFT JOIN r t ON %[4]s
		    WHERE (SELECT ok FROM dense) AND (t.partner_id IS NULL OR %[3]s)
		    UNION ALL
		    SELECT s.*, t.last_intake_id, t.partner_id IS NULL, %[3]s
		    FROM s LEFT JOIN LATERAL (
		        SELECT * FROM %[1]s t WHERE t.partner_id = $2 AND %[4]s LIMIT 1) t ON true
		    WHERE NOT (SELECT ok FROM dense) AND (t.partner_id IS NULL OR %[3]s))`,
			t.table, q(t.key[0]), differs, strings.Join(sKeyJoin, " AND "))
	}
	t.merge = fmt.Sprintf(`WITH s AS (
		    SELECT st.line, %s FROM %s st),
		%s,
		ins AS (
		    INSERT INTO %s AS t (partner_id, %s, last_intake_id)
		    SELECT $2, %s, $1 FROM j WHERE j.intake_is_new OR (j.intake_differs AND j.intake_t_last <= $1)
		    ON CONFLICT (%s) %s
		    RETURNING 1),
		conf AS (
		    INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome)
		    SELECT $3, $2, j.line, 'newer_write', 'conflict' FROM j
		    WHERE NOT j.intake_is_new AND j.intake_differs AND j.intake_t_last > $1
		    RETURNING 1)
		SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM conf), (SELECT count(*) FROM j WHERE j.intake_is_new)`,
		strings.Join(sCols, ", "), t.stage, probe,
		t.table, strings.Join(insCols, ", "), strings.Join(jCols, ", "), strings.Join(conflictCols, ", "), doUpdate)
	t.dedupe = fmt.Sprintf(`WITH d AS (
		    DELETE FROM %s s USING (
		        SELECT line, row_number() OVER (PARTITION BY %s ORDER BY line DESC) AS rn FROM %s s) x
		    WHERE x.rn > 1 AND s.line = x.line
		    RETURNING s.line)
		INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome)
		SELECT $1, $2, line, 'duplicate_key', 'rejected' FROM d`, t.stage, strings.Join(keyStage, ", "), t.stage)
}

// Plan says how chunks will reach a verified target (for check).
type Plan struct {
	// Binary: rows travel in COPY's binary format; else TextColumns names
	// the columns whose types keep them on COPY text.
	Binary      bool
	TextColumns []string
	// RangeProbe: the unique index leads with (partner_id, first key).
	RangeProbe bool
}

// Check verifies a feed's target table as the daemon would use it,
// and says how chunks will reach it.
func Check(ctx context.Context, db *pgxpool.Pool, f *partners.Feed) (Plan, error) {
	t, err := Load(ctx, db, f)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Binary: t.binary, RangeProbe: t.rangeProbe}
	if !t.binary {
		for i, c := range f.Columns {
			if t.enc[i] == nil {
				plan.TextColumns = append(plan.TextColumns, fmt.Sprintf("%s (%s into %s)", c.Name, c.Type, t.types[i]))
			}
		}
		if len(plan.TextColumns) == 0 {
			plan.TextColumns = []string{"partner_id (not text or varchar)"}
		}
	}
	return plan, nil
}
