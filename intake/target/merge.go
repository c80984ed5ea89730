package target

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/partners"
)

// loadStatements spells a target's statements once, when Load has read
// the table from the catalog: the merge and dedupe of a chunk, a
// snapshot's key record and sweep, a plan's, the unchanged look-up, and
// the collation each key is compared under.
type loadStatements struct{ *tableDef }

// build writes the chunk statements. merge: $1 = the writer id rows are
// written and judged by (a replay writes as the intake it replays, so it
// never overwrites what a newer intake wrote), $2 = partner id, $3 = the
// intake the row issues belong to. dedupe: $1 = intake id, $2 = partner id.
// the staging table holds (line, <cols>), as text or (binary) already in
// the target's types; the casts turn text into those types.
func (t *loadStatements) build() {
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
	stageHash := ""
	if t.rowHash {
		// each staged row carries the hash intake computed of it, which
		// the merge records for the rows it writes (no SQL hash of them)
		fmt.Fprintf(sig, "%s\x00bigint\x00", HashColumn)
		stageCols = append(stageCols, q(HashColumn)+" bigint")
		stageHash = ", " + q(HashColumn)
	}
	t.stage = fmt.Sprintf("intake_stage_%016x", sig.Sum64())
	format := ""
	if t.binary {
		format = " WITH (FORMAT binary)"
	}
	t.stageDDL = fmt.Sprintf("CREATE TEMP TABLE IF NOT EXISTS %s (%s) ON COMMIT DELETE ROWS", t.stage, strings.Join(stageCols, ", "))
	t.stageCopy = fmt.Sprintf("COPY %s (line, %s%s) FROM STDIN%s", t.stage, strings.Join(quoted, ", "), stageHash, format)
	hashTail := ""
	if t.rowHash {
		hashTail = ", " + q(HashColumn) // each row carries its hash (RowHasher)
	}
	t.directCopy = fmt.Sprintf("COPY %s (partner_id, %s, last_intake_id%s) FROM STDIN%s", t.table, strings.Join(quoted, ", "), hashTail, format)
	cast := func(alias string, i int) string {
		if t.collate[i] != "" {
			// a key column's collation: what the dedupe and the plan
			// compare staged keys under, as the target's index does
			return fmt.Sprintf("(%s.%s::%s%s)", alias, q(t.cols[i]), t.types[i], t.collate[i])
		}
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
	// hashOf: the hash of the feed's non-key columns of a row as the
	// target holds them (alias.col, in the target's types), what a guarded
	// target records beside last_intake_id at every write: rowHashSQL when
	// intake computes the hash itself (rowHash), else legacyHash.
	hashOf := t.legacyHash
	if t.rowHash {
		hashOf = t.rowHashSQL
	}
	hashCol := q(HashColumn)
	// edited: the row was changed outside intake since intake last wrote
	// it (a NULL hash is not known: treated as not edited).
	edited := "false"
	if t.guard {
		edited = fmt.Sprintf("(t.%[1]s IS NOT NULL AND t.%[1]s <> %[2]s)", hashCol, hashOf("t"))
		if t.rowHash {
			// rows written before intake computed the hash itself hold
			// the legacy one: either matches (AND stops at the first
			// false, so only a row whose hash is not the new one pays for
			// the second)
			edited = fmt.Sprintf("(t.%[1]s IS NOT NULL AND t.%[1]s <> %[2]s AND t.%[1]s <> %[3]s)", hashCol, hashOf("t"), t.legacyHash("t"))
		}
	}
	// set and distinct: what an update writes, and when a row differs
	// from what the file says (nil: a feed whose every column is a key
	// has nothing to update, a matching row is unchanged by definition).
	var set, distinct []string
	guard := ""
	canUpdate := (len(setCols) > 0 || t.deletedAt != "") && t.mode != partners.ModeInsertOnly
	if canUpdate {
		if len(setCols) > 0 {
			distinct = append(distinct, fmt.Sprintf("ROW(%s) IS DISTINCT FROM ROW(%s)", strings.Join(tgtVals, ", "), strings.Join(excVals, ", ")))
		}
		set = append(slices.Clone(setCols), "last_intake_id = EXCLUDED.last_intake_id")
		if t.deletedAt != "" {
			// a row a snapshot marked comes back
			set = append(set, t.deletedAt+" = NULL")
			distinct = append(distinct, "t."+t.deletedAt+" IS NOT NULL")
		}
		switch {
		case t.guard:
			set = append(set, fmt.Sprintf("%[1]s = EXCLUDED.%[1]s", hashCol))
			guard = " AND NOT " + edited
		case t.hasHash:
			set = append(set, hashCol+" = NULL") // overwrite: the hash is not kept up, so not known
		}
	}
	doUpdate := func(when string) string {
		if !canUpdate {
			return "DO NOTHING"
		}
		return fmt.Sprintf(`DO UPDATE SET %s
		    WHERE (%s) AND t.last_intake_id <= EXCLUDED.last_intake_id%s`, strings.Join(set, ", "), when, guard)
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
	for i, c := range t.cols {
		if slices.Contains(t.key, c) {
			// under the key's collation, explicitly: the column's own may
			// be another (keys.go)
			sKeyJoin = append(sKeyJoin, fmt.Sprintf("t.%s = s.%s%s", q(c), q(c), t.collate[i]))
		} else {
			sNonKey = append(sNonKey, "s."+q(c))
		}
	}
	differs := "false"
	if len(setCols) > 0 {
		differs = fmt.Sprintf("ROW(%s) IS DISTINCT FROM ROW(%s)", strings.Join(tgtVals, ", "), strings.Join(sNonKey, ", "))
	}
	if t.deletedAt != "" {
		differs = fmt.Sprintf("(%s OR t.%s IS NOT NULL)", differs, t.deletedAt)
	}
	// Which rows the merge must look at: new ones and differing ones; an
	// insert_only feed also every existing row another intake wrote (a
	// conflict even when equal).
	needs := "t.partner_id IS NULL OR " + differs
	if t.mode == partners.ModeInsertOnly {
		needs += " OR t.last_intake_id <> $1"
	}
	// Why a row is not written (NULL: it is): a key the target lacks in an
	// update_only feed; a row a newer intake wrote; an existing key in an
	// insert_only feed; a row edited outside intake (kept).
	notFound, exists, outside := "NULL", "NULL", "NULL"
	if t.mode == partners.ModeUpdateOnly {
		notFound = "'" + string(reason.NotFound) + "'"
	}
	if t.mode == partners.ModeInsertOnly {
		exists = "'" + string(reason.Exists) + "'"
	}
	if t.guard && t.keep {
		outside = fmt.Sprintf("CASE WHEN %s THEN '%s' END", edited, reason.OutsideEdit)
	}
	why := fmt.Sprintf(`CASE WHEN t.partner_id IS NULL THEN %s
		        WHEN %s AND t.last_intake_id > $1 THEN '%s'
		        ELSE coalesce(%s, %s) END`, notFound, differs, reason.NewerWrite, exists, outside)
	// s is read by the range's min and max and by the join: staged in
	// the target's types (binary), its casts are no-ops and reading the
	// staging table again is cheaper than PostgreSQL's materialising s
	// for its several readers; staged as text, its casts are made once.
	sMat := ""
	if t.binary && t.rangeProbe {
		sMat = "NOT MATERIALIZED "
	}
	insHash, selHash, sHash := "", "", ""
	if t.guard {
		insHash, selHash = ", "+hashCol, ", "+hashOf("j")
	}
	if t.rowHash {
		// the staged row's own hash (see stageHash)
		selHash, sHash = ", j."+hashCol, ", st."+hashCol
	}
	t.merge = t.mergeSQL(mergeParts{
		sMat: sMat, sCols: strings.Join(sCols, ", "), sHash: sHash, sKeyJoin: strings.Join(sKeyJoin, " AND "),
		needs: needs, why: why,
		insCols: strings.Join(insCols, ", "), insHash: insHash, jCols: strings.Join(jCols, ", "), selHash: selHash,
		conflictCols: strings.Join(conflictCols, ", "), doUpdate: doUpdate(strings.Join(distinct, " OR ")),
	})
	if canUpdate && t.mode != partners.ModeSnapshot {
		// The merge of a file while an older file of its feed may still
		// write rows (ClaimBelow): a row the file finds as it says, last
		// written at or below that older file, is claimed for the file
		// (written again as it is, last_intake_id the writer's), so the
		// older file, applied later, meets it as a newer write rather
		// than overwriting it. Claimed rows count unchanged; a row an
		// older file wrote meanwhile is written back to the file's values.
		below := "$4::int8"
		if t.rangeProbe {
			below = "$5::int8"
		}
		claim := fmt.Sprintf("(t.partner_id IS NOT NULL AND NOT (%s) AND t.last_intake_id <= %s)", differs, below)
		t.mergeClaim = t.mergeSQL(mergeParts{
			sMat: sMat, sCols: strings.Join(sCols, ", "), sHash: sHash, sKeyJoin: strings.Join(sKeyJoin, " AND "),
			needs: needs + " OR " + claim, why: fmt.Sprintf("CASE WHEN %s THEN NULL ELSE %s END", claim, why), claim: claim,
			insCols: strings.Join(insCols, ", "), insHash: insHash, jCols: strings.Join(jCols, ", "), selHash: selHash,
			conflictCols: strings.Join(conflictCols, ", "), doUpdate: doUpdate(strings.Join(distinct, " OR ")),
			claimUpdate: doUpdate("t.last_intake_id <= " + below),
		})
	}
	// A chunk of new rows when StagedDirect: staged, then inserted (with
	// the hash of each when guarded; a key that exists fails it, as it
	// fails the COPY).
	var nCols []string
	for _, c := range t.cols {
		nCols = append(nCols, "j."+q(c))
	}
	t.stageInsert = fmt.Sprintf(`INSERT INTO %s (partner_id, %s, last_intake_id%s)
		SELECT $2, %s, $1%s FROM (SELECT %s%s FROM %s st) j`,
		t.table, strings.Join(insCols, ", "), insHash, strings.Join(nCols, ", "), selHash, strings.Join(sCols, ", "), sHash, t.stage)
	if t.mode == partners.ModeSnapshot {
		t.buildSnapshot(sCols, sKeyJoin, edited)
	}
	t.buildPlan(sCols, sKeyJoin, needs, why, edited)
	t.buildUnchanged()
	t.dedupe = fmt.Sprintf(`WITH d AS (
		    DELETE FROM %s s USING (
		        SELECT line, pg_catalog.row_number() OVER (PARTITION BY %s ORDER BY line DESC) AS rn FROM %s s) x
		    WHERE x.rn > 1 AND s.line = x.line
		    RETURNING s.line)
		INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome)
		SELECT $1, $2, line, '%s', 'rejected' FROM d`, t.stage, strings.Join(keyStage, ", "), t.stage, reason.DuplicateKey)
}

// mergeParts are the pieces of a merge statement (build spells them).
type mergeParts struct {
	sMat, sCols, sHash, sKeyJoin string
	needs, why                   string
	insCols, insHash             string
	jCols, selHash               string
	conflictCols, doUpdate       string
	// claim, claimUpdate: the claiming merge's condition on a row it
	// claims, and the ON CONFLICT action that writes it ("": the plain
	// merge)
	claim, claimUpdate string
}

// mergeSQL spells a merge from its parts. It returns (applied, conflict,
// new, outside edits, exists, not found) and, when it claims, the rows it
// claimed.
//
// How each staged row meets its target row: by default a LATERAL probe
// of the unique index per row (a plain join may hash the whole, growing
// target). When the index leads with (partner_id, first key column), the
// chunk's key range is read in one index range scan and hashed instead;
// that read is capped at $4 rows (rangeCapFactor per staged row), and a
// sparse chunk whose range holds more is probed row by row, decided at
// run time within the statement. j keeps only rows that need something
// (new, differing: written or a conflict, or claimed): unchanged rows,
// all of a replay, are never materialised.
func (t *loadStatements) mergeSQL(p mergeParts) string {
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	claimCol, insWhere, claimCTE, claimCount := "", "", "", ""
	if p.claimUpdate != "" {
		claimCol = fmt.Sprintf(", %s AS intake_claim", p.claim)
		insWhere = " AND NOT j.intake_claim"
		claimCTE = fmt.Sprintf(`
		claimed AS (
		    INSERT INTO %s AS t (partner_id, %s, last_intake_id%s)
		    SELECT $2, %s, $1%s FROM j WHERE j.intake_claim
		    ON CONFLICT (%s) %s
		    RETURNING 1),`, t.table, p.insCols, p.insHash, p.jCols, p.selHash, p.conflictCols, p.claimUpdate)
		claimCount = ", (SELECT pg_catalog.count(*) FROM claimed)"
	}
	probe := fmt.Sprintf(`j AS (
		    SELECT s.*, t.partner_id IS NULL AS intake_is_new, %[1]s AS intake_reason%[5]s
		    FROM s LEFT JOIN LATERAL (
		        SELECT * FROM %[2]s t WHERE t.partner_id = $2 AND %[3]s LIMIT 1) t ON true
		    WHERE %[4]s)`,
		p.why, t.table, p.sKeyJoin, p.needs, claimCol)
	if t.rangeProbe {
		probe = fmt.Sprintf(`r AS MATERIALIZED (
		    SELECT t.* FROM %[1]s t
		    WHERE t.partner_id = $2 AND t.%[2]s%[6]s BETWEEN (SELECT pg_catalog.min(%[2]s) FROM s) AND (SELECT pg_catalog.max(%[2]s) FROM s)
		    ORDER BY t.partner_id, t.%[2]s%[6]s LIMIT $4),
		dense AS (SELECT pg_catalog.count(*) < $4 AS ok FROM r),
		j AS (
		    SELECT s.*, t.partner_id IS NULL AS intake_is_new, %[3]s AS intake_reason%[7]s
		    FROM s LEFT JOIN r t ON %[4]s
		    WHERE (SELECT ok FROM dense) AND (%[5]s)
		    UNION ALL
		    SELECT s.*, t.partner_id IS NULL, %[3]s%[7]s
		    FROM s LEFT JOIN LATERAL (
		        SELECT * FROM %[1]s t WHERE t.partner_id = $2 AND %[4]s LIMIT 1) t ON true
		    WHERE NOT (SELECT ok FROM dense) AND (%[5]s))`,
			t.table, q(t.key[0]), p.why, p.sKeyJoin, p.needs, t.collate[slices.Index(t.cols, t.key[0])], claimCol)
	}
	return fmt.Sprintf(`WITH s AS %s(
		    SELECT st.line, %s%s FROM %s st),
		%s,%s
		ins AS (
		    INSERT INTO %s AS t (partner_id, %s, last_intake_id%s)
		    SELECT $2, %s, $1%s FROM j WHERE j.intake_reason IS NULL%s
		    ON CONFLICT (%s) %s
		    RETURNING 1),
		conf AS (
		    INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome)
		    SELECT $3, $2, j.line, j.intake_reason, CASE j.intake_reason WHEN 'not_found' THEN 'rejected' ELSE 'conflict' END FROM j
		    WHERE j.intake_reason IS NOT NULL
		    RETURNING reason)
		SELECT (SELECT pg_catalog.count(*) FROM ins), (SELECT pg_catalog.count(*) FROM conf WHERE reason <> 'not_found'),
		    (SELECT pg_catalog.count(*) FROM j WHERE j.intake_is_new),
		    (SELECT pg_catalog.count(*) FROM conf WHERE reason = 'outside_edit'), (SELECT pg_catalog.count(*) FROM conf WHERE reason = 'exists'),
		    (SELECT pg_catalog.count(*) FROM conf WHERE reason = 'not_found')%s`,
		p.sMat, p.sCols, p.sHash, t.stage, probe, claimCTE,
		t.table, p.insCols, p.insHash, p.jCols, p.selHash, insWhere, p.conflictCols, p.doUpdate, claimCount)
}

// legacyHash is the row hash of a guarded target whose hash intake does
// not compute (COPY text, or a column off sendExact), and what every
// guarded target recorded before intake computed it: 64 bits of
// hash_record_extended over the non-key columns of alias, which hashes
// the values themselves (no text: no session's DateStyle or TimeZone
// changes it, 1.5 and 1.50 are one); for a type without an extended hash
// function, 64 bits of the md5 of the row's text, dates and timestamps as
// epoch seconds.
func (t *tableDef) legacyHash(alias string) string {
	var parts []string
	for i, c := range t.cols {
		if slices.Contains(t.key, c) {
			continue
		}
		v := alias + "." + pgx.Identifier{c}.Sanitize()
		if !t.hashFast && (strings.HasPrefix(t.types[i], "timestamp") || t.types[i] == "date") {
			v = "extract(epoch FROM " + v + ")"
		}
		parts = append(parts, v)
	}
	if t.hashFast {
		return fmt.Sprintf("pg_catalog.hash_record_extended(ROW(%s), 0::int8)", strings.Join(parts, ", "))
	}
	return fmt.Sprintf("('x' || pg_catalog.left(pg_catalog.md5(ROW(%s)::text), 16::int4))::bit(64)::bigint", strings.Join(parts, ", "))
}

// RowHashSQL is the SQL expression of the hash a guarded target records
// for a row of alias, as the merge computes it ("" when the target is not
// guarded); for checks and tests.
func (t *tableDef) RowHashSQL(alias string) string {
	switch {
	case !t.guard:
		return ""
	case t.rowHash:
		return t.rowHashSQL(alias)
	}
	return t.legacyHash(alias)
}

// keyText is a row's key as text, what a snapshot records of the keys it
// applied and compares the target's keys with: ROW(keys)::text, dates and
// timestamps as epoch seconds (no session setting changes it).
func (t *tableDef) keyText(alias string) string {
	var parts []string
	for _, k := range t.key {
		i := slices.Index(t.cols, k)
		v := alias + "." + pgx.Identifier{k}.Sanitize()
		if strings.HasPrefix(t.types[i], "timestamp") || t.types[i] == "date" {
			v = "extract(epoch FROM " + v + ")"
		}
		parts = append(parts, v)
	}
	return fmt.Sprintf("ROW(%s)::text", strings.Join(parts, ", "))
}

// buildSnapshot writes a snapshot feed's statements. recordKeys ($1 =
// intake id; $2 = partner where the keys are not exact) records the
// staged rows' keys, after the chunk's merge; sweep ($1 = writer, $2 =
// partner, $3 = intake id, $4 = feed) deletes, or marks, the rows intake
// wrote for the partner and feed (their last_intake_id is an intake of
// that feed) that no newer intake wrote, whose key the intake did not
// record, and (kept edits) that were not edited outside intake.
func (t *loadStatements) buildSnapshot(sCols, sKeyJoin []string, edited string) {
	t.recordKeys = fmt.Sprintf(`INSERT INTO intake_snapshot_key (intake_id, key)
		SELECT $1, %s FROM (SELECT %s FROM %s st) s ON CONFLICT DO NOTHING`, t.keyText("s"), strings.Join(sCols, ", "), t.stage)
	if !t.exactKeys {
		// each key as the target stores it, which the sweep compares
		// with: 'x-1' written over a stored 'X-1' of a citext key is the
		// key 'X-1' (keys.go); the merge wrote or kept a row for every
		// staged key (a refused row stops the sweep). A probe of the
		// unique index per row, as the merge's: a plain join may scan
		// the partner's every row per chunk.
		t.recordKeys = fmt.Sprintf(`INSERT INTO intake_snapshot_key (intake_id, key)
		SELECT $1, %s FROM (SELECT %s FROM %s st) s CROSS JOIN LATERAL (
		    SELECT * FROM %s t WHERE t.partner_id = $2 AND %s LIMIT 1) t
		ON CONFLICT DO NOTHING`, t.keyText("t"), strings.Join(sCols, ", "), t.stage, t.table, strings.Join(sKeyJoin, " AND "))
	}
	absent := fmt.Sprintf(`t.partner_id = $2 AND t.last_intake_id <= $1
		    AND EXISTS (SELECT 1 FROM file_intake f WHERE f.intake_id = t.last_intake_id AND f.partner_id = $2 AND f.feed = $4)
		    AND NOT EXISTS (SELECT 1 FROM intake_snapshot_key k WHERE k.intake_id = $3 AND k.key = %s)`, t.keyText("t"))
	if t.deletedAt != "" {
		absent = fmt.Sprintf("t.%s IS NULL AND %s", t.deletedAt, absent)
	}
	// the rows the sweep keeps, edited outside intake: counted, told
	where, kept := absent, "0::int8"
	if t.guard && t.keep {
		where += " AND NOT " + edited
		kept = fmt.Sprintf("(SELECT pg_catalog.count(*) FROM %s t WHERE %s AND %s)", t.table, absent, edited)
	}
	if t.deletedAt != "" {
		t.sweep = fmt.Sprintf(`WITH gone AS (
		    UPDATE %[1]s t SET %[2]s = pg_catalog.now(), last_intake_id = $1
		    WHERE %[3]s
		    RETURNING 1)
		SELECT pg_catalog.count(*), %[4]s FROM gone`, t.table, t.deletedAt, where, kept)
		return
	}
	t.sweep = fmt.Sprintf(`WITH gone AS (
		    DELETE FROM %s t WHERE %s
		    RETURNING 1)
		SELECT pg_catalog.count(*), %s FROM gone`, t.table, where, kept)
}
