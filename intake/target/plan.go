package target

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/partners"
)

// A plan is what a file would do to the target, computed without writing
// it: the file's valid rows are staged (the chunk's staging table, in the
// plan's own transaction) and compared set-based with the target by the
// same expressions the merge judges rows by (build: needs, reason,
// differs), so a plan counts what the merge would do against the target
// as it is at that moment. A snapshot's deletes are counted by the
// sweep's condition against the staged keys.

// PlanCounts are a plan's row outcomes. Creates + Updates + Unchanged +
// conflicts + rejects of the staged rows, plus the rows the pipeline
// rejected before staging, are the file's rows; Deletes are target rows
// (a snapshot's), not rows of the file.
type PlanCounts struct {
	// Content identifies what the plan does row by row (Plan): two plans
	// of the same counts over other keys or values differ in it. Part of
	// the plan hash, not of the counts shown.
	Content   string `json:"-"`
	Creates   int64  `json:"creates"`
	Updates   int64  `json:"updates"`
	Unchanged int64  `json:"unchanged"`
	Deletes   int64  `json:"deletes"`
	// DeletesKept: rows a snapshot would delete but keeps, edited outside
	// intake since intake wrote them (a feed that keeps such edits)
	DeletesKept int64 `json:"deletes_kept_outside_edit,omitempty"`
	// conflicts by reason: a row a newer intake wrote, a row edited
	// outside intake since intake wrote it (kept), an existing key of an
	// insert_only feed
	NewerWrite  int64 `json:"conflict_newer_write"`
	OutsideEdit int64 `json:"conflict_outside_edit"`
	Exists      int64 `json:"conflict_exists"`
	// rejects: a key an update_only feed's target lacks; a key repeated
	// later in the file (the earlier line); rows the row check or a
	// column's encoding refused (counted by the pipeline)
	NotFound   int64 `json:"rejected_not_found"`
	Duplicates int64 `json:"rejected_duplicate_key"`
	Invalid    int64 `json:"rejected_invalid"`
	// TargetRefused: rows whose value the target column's type refuses
	// (COPY text targets; the apply rejects them target_refused)
	TargetRefused int64 `json:"rejected_target_refused"`
}

// Conflicts is the plan's conflicts of every reason.
func (c PlanCounts) Conflicts() int64 { return c.NewerWrite + c.OutsideEdit + c.Exists }

// Rejects is the plan's rejected rows of every reason.
func (c PlanCounts) Rejects() int64 { return c.NotFound + c.Duplicates + c.Invalid + c.TargetRefused }

// planKey is the key a plan's row carries, which a snapshot's deletes are
// counted against: as the file writes it, or, where the target compares
// keys its own way (keys.go), as the target stores it when it holds the
// row ('s-1' of a file over a stored 'S-1' of a citext key is 'S-1').
func (t *tableDef) planKey() string {
	if t.exactKeys {
		return t.keyText("s")
	}
	return fmt.Sprintf("CASE WHEN t.partner_id IS NULL THEN %s ELSE %s END", t.keyText("s"), t.keyText("t"))
}

// buildPlan writes the plan's statements from the merge's expressions.
// planRows ($1 = writer, $2 = partner) judges every staged row into the
// temporary table intake_plan_rows (dropped at commit); planDeleteCount
// ($1 = writer, $2 = partner, $3 = feed) counts a snapshot's deletes; planChanges ($1 =
// intake id) and a snapshot's planChangesDeletes ($1 … $3 as the count's,
// $4 = intake id) record the plan's changes (RecordChanges).
func (t *loadStatements) buildPlan(sCols, sKeyJoin []string, needs, reason, edited string) {
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	var keyCols []string
	var changed []string
	for _, c := range t.cols {
		if slices.Contains(t.key, c) {
			keyCols = append(keyCols, "s0."+q(c))
			continue
		}
		changed = append(changed, fmt.Sprintf(`CASE WHEN t.%[1]s IS DISTINCT FROM s.%[1]s
		        THEN pg_catalog.jsonb_build_object(%[2]s, pg_catalog.jsonb_build_array(t.%[1]s::text, s.%[1]s::text)) ELSE '{}'::jsonb END`, q(c), quoteLiteral(c)))
	}
	changedExpr := "NULL::jsonb"
	if len(changed) > 0 {
		changedExpr = strings.Join(changed, " || ")
	}
	t.planRows = fmt.Sprintf(`CREATE TEMP TABLE intake_plan_rows ON COMMIT DROP AS
		WITH s0 AS (
		    SELECT st.line, %[1]s FROM %[2]s st),
		d AS (
		    SELECT s0.*, pg_catalog.row_number() OVER (PARTITION BY %[3]s ORDER BY s0.line DESC) AS intake_rn FROM s0),
		j AS (
		    SELECT s.line, s.intake_rn, %[4]s AS intake_key, t.partner_id IS NULL AS intake_is_new,
		        (%[5]s) AS intake_needs, %[6]s AS intake_reason,
		        CASE WHEN t.partner_id IS NOT NULL THEN %[7]s END AS intake_changed
		    FROM d s LEFT JOIN LATERAL (
		        SELECT * FROM %[8]s t WHERE t.partner_id = $2 AND %[9]s LIMIT 1) t ON true)
		SELECT line, intake_key AS key,
		    CASE WHEN intake_rn > 1 THEN 'rejected'
		         WHEN NOT intake_needs THEN 'unchanged'
		         WHEN intake_reason = 'not_found' THEN 'rejected'
		         WHEN intake_reason IS NOT NULL THEN 'conflict'
		         WHEN intake_is_new THEN 'create'
		         ELSE 'update' END AS action,
		    CASE WHEN intake_rn > 1 THEN 'duplicate_key' WHEN intake_needs THEN intake_reason END AS reason,
		    CASE WHEN intake_rn = 1 AND intake_needs AND intake_reason IS NULL THEN intake_changed END AS changed
		FROM j`,
		strings.Join(sCols, ", "), t.stage, strings.Join(keyCols, ", "), t.planKey(),
		needs, reason, changedExpr, t.table, strings.Join(sKeyJoin, " AND "))
	t.planChanges = fmt.Sprintf(planChangesSQL, "$1", fmt.Sprintf(planChangeRows, "$1"))
	if t.mode != partners.ModeSnapshot {
		return
	}
	absent := fmt.Sprintf(`t.partner_id = $2 AND t.last_intake_id <= $1
		    AND EXISTS (SELECT 1 FROM file_intake f WHERE f.intake_id = t.last_intake_id AND f.partner_id = $2 AND f.feed = $3)
		    AND NOT EXISTS (SELECT 1 FROM intake_plan_rows k WHERE k.key = %s)`, t.keyText("t"))
	if t.deletedAt != "" {
		absent += " AND t." + t.deletedAt + " IS NULL"
	}
	// the rows the sweep would keep, edited outside intake (the sweep's
	// own count, merge.go buildSnapshot)
	where, kept := absent, "0::int8"
	if t.guard && t.keep {
		where += " AND NOT " + edited
		kept = fmt.Sprintf("(SELECT pg_catalog.count(*) FROM %s t WHERE %s AND %s)", t.table, absent, edited)
	}
	t.planDeleteCount = fmt.Sprintf(`SELECT pg_catalog.count(*),
		    coalesce(pg_catalog.sum(pg_catalog.hashtextextended(%s, 0::int8)::numeric), 0)::text, %s FROM %s t WHERE %s`, t.keyText("t"), kept, t.table, where)
	// a delete's seq is past the file's last line, in key order
	t.planChangesDeletes = fmt.Sprintf(planChangesSQL, "$4", fmt.Sprintf(planChangeRows, "$4")+fmt.Sprintf(`
		UNION ALL
		SELECT $4::int8, m.last + pg_catalog.row_number() OVER (ORDER BY d.key), NULL::int8, 'delete', NULL::text, d.key, NULL::jsonb
		FROM (SELECT %s AS key FROM %s t WHERE %s) d,
		    (SELECT coalesce(pg_catalog.max(line), 0) AS last FROM intake_plan_rows) m`, t.keyText("t"), t.table, where))
}

// planChangeRows are a plan's changed rows of the file, as
// intake_plan_change rows of intake %[1]s: a row's seq is its line.
const planChangeRows = `SELECT %[1]s::int8, line, line, action, reason, key, changed FROM intake_plan_rows WHERE action <> 'unchanged'`

// planChangesSQL records a plan's changes (%[2]s, the rows of intake
// %[1]s) in intake_plan_change, and the columns each changes in
// intake_plan_change_column, in one statement.
const planChangesSQL = `WITH c AS (
		INSERT INTO intake_plan_change (intake_id, seq, line, action, reason, key, changed)
		%[2]s
		RETURNING seq, changed)
	INSERT INTO intake_plan_change_column (intake_id, col, seq)
	SELECT %[1]s::int8, k.col, c.seq FROM c, pg_catalog.jsonb_object_keys(c.changed) AS k(col)
	WHERE c.changed IS NOT NULL`

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// planner judges a file's staged rows by the merge's expressions without
// writing them: a plan.
type planner struct{ *tableDef }

// Plan judges the rows staged in tx (Stage, CopyStage: every valid row of
// the file) against the target, written and judged as writer for the
// partner and feed, and returns the counts (Invalid is the caller's);
// RecordChanges records its changes for a plan that waits. sweep: a
// snapshot's deletes are counted (the apply sweeps only when the file has
// rows and none is rejected: the caller says whether the pipeline
// rejected any, and a plan that rejects one deletes nothing). Nothing is written
// but temporary tables of the transaction.
func (t *planner) Plan(ctx context.Context, tx pgx.Tx, writer int64, partner, feed string, sweep bool) (PlanCounts, error) {
	var c PlanCounts
	if _, err := tx.Exec(ctx, "SAVEPOINT intake_plan"); err != nil {
		return c, fmt.Errorf("plan: %w", err)
	}
	_, err := tx.Exec(ctx, t.planRows, writer, partner)
	var pe *pgconn.PgError
	if err != nil && !t.binary && errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22") {
		// a staged text value the target's type refuses (the apply
		// rejects that row target_refused): drop such rows, count them,
		// and judge the rest
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT intake_plan"); err != nil {
			return c, fmt.Errorf("plan: %w", err)
		}
		if c.TargetRefused, err = t.dropUncastable(ctx, tx); err != nil {
			return c, fmt.Errorf("plan: refused values: %w", err)
		}
		_, err = tx.Exec(ctx, t.planRows, writer, partner)
	}
	if err != nil {
		return c, fmt.Errorf("plan rows: %w", err)
	}
	rs, err := tx.Query(ctx, `SELECT action, coalesce(reason, ''), pg_catalog.count(*) FROM intake_plan_rows GROUP BY 1, 2`)
	if err != nil {
		return c, fmt.Errorf("plan counts: %w", err)
	}
	for rs.Next() {
		var action, reason string
		var n int64
		if err := rs.Scan(&action, &reason, &n); err != nil {
			rs.Close()
			return c, err
		}
		switch action + "/" + reason {
		case "create/":
			c.Creates += n
		case "update/":
			c.Updates += n
		case "unchanged/":
			c.Unchanged += n
		case "conflict/newer_write":
			c.NewerWrite += n
		case "conflict/outside_edit":
			c.OutsideEdit += n
		case "conflict/exists":
			c.Exists += n
		case "rejected/not_found":
			c.NotFound += n
		case "rejected/duplicate_key":
			c.Duplicates += n
		default:
			rs.Close()
			return c, fmt.Errorf("plan: unexpected outcome %s/%s", action, reason)
		}
	}
	if err := rs.Err(); err != nil {
		return c, fmt.Errorf("plan counts: %w", err)
	}
	// what the plan does row by row, beside its counts: the sum of a hash
	// of each row's key, action, reason and changed values (order-free,
	// exact, constant memory), then the same of the deleted keys
	if err := tx.QueryRow(ctx, `SELECT coalesce(pg_catalog.sum(pg_catalog.hashtextextended(
		    action || '/'::text || coalesce(reason, '') || '/'::text || key || '/'::text || coalesce(changed::text, ''), 0::int8)::numeric), 0)::text
		FROM intake_plan_rows`).Scan(&c.Content); err != nil {
		return c, fmt.Errorf("plan content: %w", err)
	}
	// a repeated key's earlier line is rejected, but the key is in the
	// file (its later line): the sweep runs as the apply's does
	// (intake/apply.go snapshotSweep)
	if t.planDeleteCount != "" && sweep && c.Rejects()-c.Duplicates == 0 {
		var deleted string
		if err := tx.QueryRow(ctx, t.planDeleteCount, writer, partner, feed).Scan(&c.Deletes, &deleted, &c.DeletesKept); err != nil {
			return c, fmt.Errorf("plan deletes: %w", err)
		}
		c.Content += " deletes " + deleted
		if c.DeletesKept > 0 {
			c.Content += fmt.Sprintf(" kept %d", c.DeletesKept)
		}
	}
	return c, nil
}

// RecordChanges records every change of the plan Plan has just judged in
// tx (the rows of intake_plan_rows but the unchanged ones, and, deletes:
// the snapshot's deletes Plan counted, by the same condition) as
// intake_plan_change rows of intake id, with the columns each update
// changes in intake_plan_change_column: one INSERT … SELECT, no row
// through the client. The caller has removed an earlier plan's rows of
// the file (ledger.RecordPlan).
func (t *planner) RecordChanges(ctx context.Context, tx pgx.Tx, id, writer int64, partner, feed string, deletes bool) error {
	var err error
	if deletes && t.planChangesDeletes != "" {
		_, err = tx.Exec(ctx, t.planChangesDeletes, writer, partner, feed, id)
	} else {
		_, err = tx.Exec(ctx, t.planChanges, id)
	}
	if err != nil {
		return fmt.Errorf("plan changes: %w", err)
	}
	return nil
}

// castableFunc tells whether a text value is valid input of a type: a
// function of the session's temporary schema (no privilege beyond the
// temporary tables intake uses already), used only when a plan's casts
// failed.
const castableFunc = `CREATE OR REPLACE FUNCTION pg_temp.intake_castable(v text, typ text) RETURNS boolean
	LANGUAGE plpgsql AS $f$
	BEGIN
	    IF v IS NULL THEN RETURN true; END IF;
	    EXECUTE pg_catalog.format('SELECT %L::%s', v, typ);
	    RETURN true;
	EXCEPTION WHEN data_exception THEN
	    RETURN false;
	END $f$`

// dropUncastable deletes the staged rows (text) with a value the target
// column's type refuses and returns how many.
func (t *planner) dropUncastable(ctx context.Context, tx pgx.Tx) (int64, error) {
	if _, err := tx.Exec(ctx, castableFunc); err != nil {
		return 0, err
	}
	var checks []string
	for i, c := range t.cols {
		checks = append(checks, fmt.Sprintf("pg_temp.intake_castable(st.%s, %s)", pgx.Identifier{c}.Sanitize(), quoteLiteral(t.types[i])))
	}
	var n int64
	err := tx.QueryRow(ctx, fmt.Sprintf(`WITH d AS (DELETE FROM %s st WHERE NOT (%s) RETURNING 1) SELECT pg_catalog.count(*) FROM d`,
		t.stage, strings.Join(checks, " AND "))).Scan(&n)
	return n, err
}
