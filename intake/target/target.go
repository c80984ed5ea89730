// Package target is what intake knows of a partner's target table: the
// catalog's description of it (catalog.go), the check that a feed can be
// written into it (Load, Check: target.go), the comparison of each feed
// column with its target column (Compare: compare.go), the statements that
// write a chunk into it (built in merge.go, run through write.go: COPY
// straight in, or staged, deduplicated and merged) and the COPY binary
// encoders of the values (binary.go). The pipeline in package intake gets a
// *Table from a Cache and calls its methods on its own transaction; it
// sees no SQL of the target's.
package target

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/partners"
)

// Table is a feed's target table as the database describes it, with the
// statements that merge a staged chunk into it. Its parts share the one
// tableDef Load built: the statements spelled then, a chunk's writes, a
// plan.
type Table struct {
	*tableDef
	loadStatements
	chunkWrites
	planner
}

func newTable(d *tableDef) *Table {
	return &Table{tableDef: d, loadStatements: loadStatements{d}, chunkWrites: chunkWrites{d}, planner: planner{d}}
}

// tableDef is what the parts of a Table share: the table, the feed's
// columns and key as the catalog types them, and the text of the
// statements Load spelled (and the expressions they are spelled from).
type tableDef struct {
	table string   // quoted, possibly schema-qualified
	cols  []string // feed columns in file order
	types []string // their types in the target, for casts from staged text
	oids  []uint32 // their type oids in the target
	key   []string
	merge string // merge from the staging table; returns (applied, conflict, new)
	// mergeClaim: the merge that also claims the rows it finds as they
	// are for the writer (Merge's claimBelow; "" for modes that never
	// claim: insert_only, snapshot)
	mergeClaim string
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
	// guard: the target has the intake_row_hash column, the feed keeps
	// edits made outside intake (keep) and has columns besides its key:
	// every write records a hash of the feed's columns as written and the
	// merge tells a row edited outside intake since (see build). hasHash
	// without guard (on_outside_edit: overwrite): writes clear the hash
	// ("not known"), so the feed pays nothing for it. hashFast: every
	// non-key column's type has an extended hash function, so the hash is
	// hash_record_extended over the values (else md5 of their text).
	guard, keep, hasHash, hashFast bool
	// rowHash: a guarded target whose hash intake computes from each row
	// it encodes for COPY binary (RowHasher: see rowhash.go), which
	// rowHashSQL recomputes from the stored values. New keys then go COPY straight into the target with
	// their hash. Else (COPY text, or a column whose encoding is not its
	// stored send form: sendExact) the hash is hash_record_extended,
	// computed by the server from the staging table (legacyHash).
	// hashCols: the hashed columns (the feed's non-key columns), indexes
	// into cols, when rowHash.
	rowHash  bool
	hashCols []int
	mode     partners.Mode
	// deletedAt: the quoted column a snapshot marks absent rows in ("":
	// they are deleted).
	deletedAt string
	// recordKeys and sweep: a snapshot's statements (see build).
	recordKeys, sweep string
	// stageInsert: a chunk of new rows from the staging table into the
	// target with their hashes (the guarded target's direct path: COPY
	// cannot compute the hash).
	stageInsert string
	// unchangedRange, unchangedKeys: the look-up of a chunk's rows the
	// target holds as they are ("" when it has none: see LooksUpUnchanged).
	unchangedRange, unchangedKeys string
	// unchangedOK: the look-up reads one more column, whether a row may
	// count unchanged at all; unchangedKeysRecord: a snapshot's record of
	// the keys of the rows it leaves out.
	unchangedOK         bool
	unchangedKeysRecord string
	// keyIdx: the key columns, indexes into cols, in column order (what
	// a row's key hash reads); keyOrder: the same in the key's order
	// (what a snapshot's key text reads); key0: the first key column's.
	keyIdx, keyOrder []int
	key0             int
	// planRows and planDeletes: a plan's statements (plan.go).
	planRows, planDeleteCount string
	// planChanges, planChangesDeletes: a plan's changes recorded (plan.go)
	planChanges, planChangesDeletes string
	// exactKeys: the target compares keys as intake's normalised text of
	// them (keys.go); else every chunk is deduplicated in SQL. collate:
	// per column, the collation a key column is compared under, its
	// unique index's or its own (" COLLATE x"; "" for the other columns
	// and for a key compared under the database's default as its column
	// is: keyEquality).
	exactKeys bool
	collate   []string
	// collOverride: per column, the key is compared under its unique
	// index's collation, not its column's (an index would not serve a
	// comparison under the column's: see buildUnchanged).
	collOverride []bool
	// keysCompared: the key columns that make the keys not exact, as
	// intake check names them.
	keysCompared []string
}

// HashColumn is the target column in which intake records a hash of the
// feed's columns as it last wrote them (bigint, nullable: NULL is "not
// known", as for rows written before the column was added, and is filled
// by the next write). Without it edits made outside intake are not told
// and are overwritten.
const HashColumn = "intake_row_hash"

// Error says what is wrong with a target table, and how to fix it.
type Error struct {
	Table  string
	Detail string
}

func (e *Error) Error() string { return fmt.Sprintf("target table %s: %s", e.Table, e.Detail) }

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
	b.WriteString("\x00\x03mode\x00" + string(modeOf(f)) + "\x00" + string(outsideEditOf(f)) + "\x00" + f.DeletedAt)
	return b.String()
}

func modeOf(f *partners.Feed) partners.Mode {
	if f.Mode == "" {
		return partners.ModeUpsert
	}
	return f.Mode
}

func outsideEditOf(f *partners.Feed) partners.OutsideEdit {
	if f.OnOutsideEdit == "" {
		return partners.OutsideEditKeep
	}
	return f.OnOutsideEdit
}

// Cache holds the checked target of each feed mapping a daemon writes,
// keyed by mappingKey: two partners may have a feed of one name writing
// one table with their columns in another order, and each must get the
// statements of its own columns.
type Cache struct {
	db *pgxpool.Pool
	mu sync.Mutex
	m  map[string]*Table
}

// NewCache returns an empty cache of the targets in db.
func NewCache(db *pgxpool.Pool) *Cache {
	return &Cache{db: db, m: map[string]*Table{}}
}

// Get returns the checked target of a feed, loading it on first use, on
// connections of the cache's pool: a caller asks before it holds a
// connection of that pool (a plan resolves its table before its
// transaction, an apply ahead before its connection), so a first load
// never waits for a connection its caller holds. The load runs without
// the cache's lock, so no caller waits behind another's load that waits
// for a connection, such as a held feed's retry (intake/targethold.go).
// Two loads of one mapping at once keep the first stored; Load only
// reads the catalog.
func (c *Cache) Get(ctx context.Context, f *partners.Feed) (*Table, error) {
	key := mappingKey(f)
	c.mu.Lock()
	t, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	t, err := Load(ctx, c.db, f)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if first, ok := c.m[key]; ok {
		return first, nil
	}
	c.m[key] = t
	return t, nil
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
	typmods := map[string]int32{}
	for n, c := range tt.cols {
		types[n], oids[n], typmods[n] = c.typ, c.oid, c.typmod
	}
	t := newTable(&tableDef{table: ident.Sanitize(), key: f.Key, mode: modeOf(f), keep: outsideEditOf(f) == partners.OutsideEditKeep})
	if types["partner_id"] == "" {
		return nil, &Error{Table: f.Target, Detail: "missing column partner_id (text)"}
	}
	if types["last_intake_id"] != "bigint" {
		return nil, &Error{Table: f.Target, Detail: "missing column last_intake_id bigint (intake's bookkeeping)"}
	}
	switch types[HashColumn] {
	case "":
	case "bigint":
		t.hasHash = true
		t.guard = t.keep && len(f.Columns) > len(f.Key)
	default:
		return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("column %s is %s: it must be bigint (intake's bookkeeping)", HashColumn, types[HashColumn])}
	}
	if f.DeletedAt != "" {
		switch types[f.DeletedAt] {
		case "timestamp with time zone", "timestamp without time zone":
			t.deletedAt = pgx.Identifier{f.DeletedAt}.Sanitize()
		case "":
			return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("missing column %s (deleted_at of feed %s: timestamptz)", f.DeletedAt, f.Name)}
		default:
			return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("column %s is %s: deleted_at needs timestamptz", f.DeletedAt, types[f.DeletedAt])}
		}
	}
	for _, c := range f.Columns {
		typ, ok := types[c.Name]
		if !ok {
			return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("missing column %s declared by feed %s", c.Name, f.Name)}
		}
		t.cols = append(t.cols, c.Name)
		t.types = append(t.types, typ)
		t.oids = append(t.oids, oids[c.Name])
		t.enc = append(t.enc, binaryEncoder(c.Type, oids[c.Name], typmods[c.Name]))
	}
	// COPY binary when every column has an encoder and partner_id is text
	t.binary = oids["partner_id"] == oidText || oids["partner_id"] == oidVarchar
	for _, e := range t.enc {
		t.binary = t.binary && e != nil
	}
	// The row hash is intake's own (computed as it encodes each row, so
	// new keys go COPY straight into a guarded target) when the chunks
	// travel in binary and what is encoded of every hashed column is its
	// stored value's send form.
	if t.guard && t.binary {
		t.rowHash = true
		for i, c := range t.cols {
			if !slices.Contains(t.key, c) {
				t.hashCols = append(t.hashCols, i)
				t.rowHash = t.rowHash && sendExact(t.oids[i], typmods[c])
			}
		}
		if t.rowHash {
			ok, err := checkRowHash(ctx, db)
			if err != nil {
				return nil, fmt.Errorf("target %s: %w", f.Target, err)
			}
			t.rowHash = ok
		}
		if !t.rowHash {
			t.hashCols = nil
		}
	}

	// found: a unique index on exactly (partner_id, key...); leading: one
	// of them starts with (partner_id, first key column), so a chunk's
	// key range is one index range scan.
	var found, leading bool
	err = db.QueryRow(ctx, `SELECT pg_catalog.count(*) > 0, coalesce(pg_catalog.bool_or(
		    (SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum = i.indkey[0]) = 'partner_id'
		    AND (SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum = i.indkey[1]) = $3), false)
		FROM pg_index i WHERE `+arbiterIndexes,
		oid, append([]string{"partner_id"}, f.Key...), f.Key[0]).Scan(&found, &leading)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", f.Target, err)
	}
	if !found {
		return nil, &Error{Table: f.Target, Detail: fmt.Sprintf("needs a unique index on exactly (partner_id, %s): valid, not partial, not deferrable, without expressions", strings.Join(f.Key, ", "))}
	}
	t.rangeProbe = leading
	if err := t.keyEquality(ctx, db, tt, f); err != nil {
		if te := (*Error)(nil); errors.As(err, &te) {
			return nil, err
		}
		return nil, fmt.Errorf("target %s: %w", f.Target, err)
	}
	if t.guard {
		// hash_record_extended needs an extended hash function of every
		// type; it looks them up even for NULLs, so a row of NULLs asks
		var nulls []string
		for i, c := range t.cols {
			if !slices.Contains(t.key, c) {
				nulls = append(nulls, "NULL::"+t.types[i])
			}
		}
		var h int64
		err := db.QueryRow(ctx, fmt.Sprintf("SELECT pg_catalog.hash_record_extended(ROW(%s), 0::int8)", strings.Join(nulls, ", "))).Scan(&h)
		var pe *pgconn.PgError
		switch {
		case err == nil:
			t.hashFast = true
		case errors.As(err, &pe) && pe.Code == "42883": // undefined_function: a type without one
		default:
			return nil, fmt.Errorf("target %s: %w", f.Target, err)
		}
	}
	t.build()
	return t, nil
}

// arbiterIndexes selects, of pg_index i, the unique indexes of table $1
// on exactly the columns $2 (partner_id and the key) that ON CONFLICT
// (partner_id, key...) arbitrates with: valid, immediate, not partial and
// without expressions. Load's check that one exists and keyEquality's
// reading of their collations share it.
const arbiterIndexes = `i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL
		  AND (SELECT pg_catalog.array_agg(a2.attname::text ORDER BY a2.attname) FROM pg_attribute a2
		       WHERE a2.attrelid = $1 AND a2.attnum = ANY(i.indkey)) = (SELECT pg_catalog.array_agg(x ORDER BY x) FROM pg_catalog.unnest($2::text[]) x)
		  AND pg_catalog.cardinality(i.indkey::int2[]) = pg_catalog.cardinality($2::text[])`

// keyEquality decides how the target compares the feed's keys (keys.go):
// under which collation each key column is compared (collate) and whether
// that is intake's byte comparison (exactKeys). The collation is the one
// the unique indexes on exactly (partner_id, key...) give the column:
// each of them arbitrates ON CONFLICT, so one that compares a key under a
// nondeterministic collation (an index (partner_id, k COLLATE ci) on a
// plain text column) makes byte-different keys one, and one of a
// deterministic collation on a column of a nondeterministic one makes
// them two. A partner_id compared under a nondeterministic collation is
// refused.
func (t *loadStatements) keyEquality(ctx context.Context, db *pgxpool.Pool, tt *catalogTable, f *partners.Feed) error {
	type coll struct {
		name          string // schema-qualified and quoted (the database's default: pg_catalog."default")
		deterministic bool
	}
	byIndex := map[string][]coll{}
	rs, err := db.Query(ctx, `SELECT DISTINCT a.attname::text,
		    pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname),
		    c.collisdeterministic
		FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS k(attnum, coll)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		JOIN pg_collation c ON c.oid = k.coll
		JOIN pg_namespace n ON n.oid = c.collnamespace
		WHERE `+arbiterIndexes,
		tt.oid, append([]string{"partner_id"}, f.Key...))
	if err != nil {
		return err
	}
	for rs.Next() {
		var col string
		var c coll
		if err := rs.Scan(&col, &c.name, &c.deterministic); err != nil {
			rs.Close()
			return err
		}
		byIndex[col] = append(byIndex[col], c)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return err
	}
	// the collation a column is compared under: a nondeterministic one
	// of an index, else an index's own, else the column's (the
	// database's default named as such: pg_catalog."default")
	const dflt = `pg_catalog."default"`
	compared := func(name string) (coll, error) {
		col := tt.cols[name]
		own := coll{cmp.Or(col.collation, dflt), col.deterministic}
		var loose *coll
		for _, c := range byIndex[name] {
			if c.deterministic {
				continue
			}
			if loose != nil && loose.name != c.name {
				// which of two is coarser is not known: either
				// arbiter may refuse what the other's dedupe let by
				return coll{}, &Error{Table: f.Target, Detail: fmt.Sprintf("the unique indexes on the key compare %s under two nondeterministic collations (%s and %s): keep one", name, loose.name, c.name)}
			}
			loose = &c
		}
		if loose != nil {
			return *loose, nil
		}
		for _, c := range byIndex[name] {
			if c.name != own.name {
				return c, nil
			}
		}
		return own, nil
	}
	// partner_id: its column's collation (every statement's filter on
	// it) and its indexes' must all be deterministic
	for _, c := range append(byIndex["partner_id"], coll{cmp.Or(tt.cols["partner_id"].collation, dflt), tt.cols["partner_id"].deterministic}) {
		if !c.deterministic {
			return &Error{Table: f.Target, Detail: fmt.Sprintf("partner_id is compared under the nondeterministic collation %s (its column's or its unique index's): partners whose ids it holds equal would write each other's rows (give it a deterministic one)", c.name)}
		}
	}
	t.exactKeys = true
	t.collate = make([]string, len(t.cols))
	t.collOverride = make([]bool, len(t.cols))
	for i, fc := range f.Columns {
		if !slices.Contains(t.key, fc.Name) {
			continue
		}
		c, err := compared(fc.Name)
		if err != nil {
			return err
		}
		col := tt.cols[fc.Name]
		tc := *col
		tc.deterministic = c.deterministic
		if !keyExact(fc, &tc) {
			t.exactKeys = false
			t.keysCompared = append(t.keysCompared, fmt.Sprintf("%s (%s, compared under %s)", fc.Name, col.typ, c.name))
		}
		// no COLLATE where the key is compared under the database's
		// default as its column is (an ordinary target's statements
		// are as they were); else the collation, explicitly, even the
		// default where an index compares a column of another one so
		t.collOverride[i] = c.name != cmp.Or(col.collation, dflt)
		if c.name != dflt || t.collOverride[i] {
			t.collate[i] = " COLLATE " + c.name
		}
	}
	return nil
}

// Plan says how chunks will reach a verified target (for check).
type Plan struct {
	// Binary: rows travel in COPY's binary format; else TextColumns names
	// the columns whose types keep them on COPY text.
	Binary      bool
	TextColumns []string
	// RangeProbe: the unique index leads with (partner_id, first key).
	RangeProbe bool
	// Guard: the target has intake_row_hash, so edits made outside intake
	// are told (and kept or overwritten per on_outside_edit).
	Guard bool
	// KeysCompared names the key columns the target compares its own way
	// (citext, a collation of their own, a type that reads one value
	// several ways: keys.go); empty when it compares keys as intake's
	// normalised text.
	KeysCompared []string
}

// Check verifies a feed's target table as the daemon would use it,
// and says how chunks will reach it.
func Check(ctx context.Context, db *pgxpool.Pool, f *partners.Feed) (Plan, error) {
	t, err := Load(ctx, db, f)
	if err != nil {
		return Plan{}, err
	}
	plan := Plan{Binary: t.binary, RangeProbe: t.rangeProbe, Guard: t.guard}
	plan.KeysCompared = t.keysCompared
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
