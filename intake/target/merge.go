package target

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
