package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/console"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

// statements records the statements a pool runs, with their arguments.
type statements struct {
	mu  sync.Mutex
	got []statement
}

type statement struct {
	sql  string
	args []any
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, statement{d.SQL, d.Args})
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take that mention
// table.
func (s *statements) take(table string) []statement {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []statement
	for _, st := range s.got {
		if strings.Contains(st.sql, table) {
			out = append(out, st)
		}
	}
	s.got = nil
	return out
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON).
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Removed  float64    `json:"Rows Removed by Filter"`
	Recheck  float64    `json:"Rows Removed by Index Recheck"`
	Plans    []planNode `json:"Plans"`
}

// explain runs st under EXPLAIN (ANALYZE, FORMAT JSON) and returns the
// most rows any node of its plan read (rows produced and removed by its
// filter, × loops) and the
// relations it read with a Seq Scan.
func explain(t *testing.T, pool *pgxpool.Pool, st statement) (float64, []string, string) {
	t.Helper()
	var raw []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, FORMAT JSON) "+st.sql, st.args...).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", st.sql, err)
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	var most float64
	var seq []string
	var walk func(n planNode)
	walk = func(n planNode) {
		most = max(most, (n.Rows+n.Removed+n.Recheck)*max(n.Loops, 1))
		if n.Type == "Seq Scan" {
			seq = append(seq, n.Relation)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(out[0].Plan)
	return most, seq, string(raw)
}

// The console pages a queue of 10,000 held files, one of 10,000 waiting
// plans and a plan of 1,000,000 changes a page at a time: the held
// queue's and the waiting plans' first pages, the plan's
// first page, a page in its middle (keyset), and pages filtered by each
// kind of action, a rare column, an exact key and a key prefix each render a
// page of rows, and EXPLAIN ANALYZE of the statement each page ran finds
// no node that read ten pages' worth of rows (produced or filtered out)
// and no Seq Scan of the changes or the held queue. No timing is asserted.
func TestPagesStayBoundedOnAMillionChanges(t *testing.T) {
	url, seed := testenv.DB(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := seed.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// 10,000 held files, one a second apart
	exec(`INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, reason, worker_id, lease_until, content_sha256)
		SELECT 'acme', 'orders', 'held-' || i || '.csv', 'quarantine/held-' || i || '.csv', 10, 'quarantined', 'reject_rate', 'w1', now(), 'ab12'
		FROM generate_series(1, 10000) i`)
	exec(`INSERT INTO intake_quarantine (intake_id, partner_id, reason, content_sha256, path, held_at)
		SELECT intake_id, 'acme', 'reject_rate', 'ab12', claimed_path, now() - intake_id * interval '1 second' FROM file_intake`)
	// 10,000 plans waiting for approval
	exec(`INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, reason, worker_id, lease_until,
		    content_sha256, rows_total, plan_hash, plan_counts, planned_at)
		SELECT 'acme', 'orders', 'wait-' || i || '.csv', 'processing/w1/wait-' || i || '.csv', 10, 'awaiting_approval', 'awaiting_approval', 'w1',
		    now(), 'ef56', 10, 'h' || i, '{"updates": 10}', now() - i * interval '1 second'
		FROM generate_series(1, 10000) i`)
	// one plan of 1,000,000 changes: lines 2 … 950,001 update qty (every
	// thousandth also amount), every twentieth line is a create, then
	// 50,000 deletes
	var id int64
	if err := seed.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size,
		    state, reason, worker_id, lease_until, content_sha256, rows_total, plan_hash, plan_counts, planned_at)
		VALUES ('acme', 'orders', 'big.csv', 'processing/w1/big.csv', 10, 'awaiting_approval', 'awaiting_approval', 'w1',
		    now(), 'cd34', 950000, 'h9', '{"creates": 47500, "updates": 902500, "deletes": 50000}', now())
		RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	exec(`WITH c AS (
		    INSERT INTO intake_plan_change (intake_id, seq, line, action, key, changed)
		    SELECT $1::int8, i, i, CASE WHEN i % 20 = 0 THEN 'create' ELSE 'update' END, 'K-' || lpad(i::text, 7, '0'),
		        CASE WHEN i % 20 = 0 THEN NULL
		             WHEN i % 1000 = 1 THEN jsonb_build_object('qty', jsonb_build_array('1', '2'), 'amount', jsonb_build_array('1.00', 'A-' || i))
		             ELSE jsonb_build_object('qty', jsonb_build_array('1', '2')) END
		    FROM generate_series(2, 950001) i
		    UNION ALL
		    SELECT $1::int8, 950001 + i, NULL, 'delete', 'D-' || lpad(i::text, 7, '0'), NULL FROM generate_series(1, 50000) i
		    RETURNING seq, changed)
		INSERT INTO intake_plan_change_column (intake_id, col, seq)
		SELECT $1::int8, k, c.seq FROM c, jsonb_object_keys(c.changed) k WHERE c.changed IS NOT NULL`, id)
	exec(`ANALYZE intake_plan_change`)
	exec(`ANALYZE intake_plan_change_column`)
	exec(`ANALYZE intake_quarantine`)
	exec(`ANALYZE file_intake`)
	if n := testenv.Count(t, seed, `SELECT count(*) FROM intake_plan_change WHERE intake_id = $1`, id); n != 1_000_000 {
		t.Fatalf("%d changes seeded, want 1,000,000", n)
	}

	rec := &statements{}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	migrations.SetSearchPath(cfg.ConnConfig)
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := newConsole(t, pool)
	target := fmt.Sprintf("/plans/%d", id)
	for _, c := range []struct {
		name, path, table string
		marker            string // one per row shown
		rows              int
		has               []string
	}{
		{"held queue", "/held", "FROM intake_quarantine q", `<td><a href="/files/`, console.PageSize, []string{"10000 held"}},
		{"waiting plans", "/plans", "awaiting_approval", `<tr><td><a href="/plans/`, console.PageSize, []string{"10001 waiting"}},
		{"plan, first page", target, "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{"1000000 changes in the plan", keyCell("K-0000002"), `?after=51&amp;plan=`}},
		{"plan, a middle page", target + "?after=500000", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("K-0500001"), `?before=500001&amp;plan=`}},
		{"plan, deletes", target + "?action=delete", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("D-0000001")}},
		{"plan, updates", target + "?action=update&after=500000", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("K-0500001")}},
		{"plan, creates", target + "?action=create&after=500000", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("K-0500020")}},
		{"plan, a rare column", target + "?column=amount&after=400000", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("K-0400001"), "A-400001"}},
		{"plan, an exact key", target + "?key=K-0777777&match=exact", "intake_plan_change", `<td class="key">`, 1,
			[]string{keyCell("K-0777777")}},
		{"plan, a key prefix", target + "?key=K-00012", "intake_plan_change", `<td class="key">`, console.PageSize,
			[]string{keyCell("K-0001200")}},
	} {
		rec.take("") // forget the statements before this page
		code, _, body := do(t, h, reviewer, "GET", c.path, nil)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", c.name, code, body)
		}
		if n := strings.Count(body, c.marker); n != c.rows {
			t.Errorf("%s: %d rows shown, want %d", c.name, n, c.rows)
		}
		for _, s := range c.has {
			if !strings.Contains(body, s) {
				t.Errorf("%s: %q missing", c.name, s)
			}
		}
		sts := rec.take(c.table)
		var page []statement
		for _, st := range sts {
			if !strings.Contains(st.sql, "count(*)") {
				page = append(page, st)
			}
		}
		if len(page) != 1 {
			t.Fatalf("%s: %d page statements on %s, want 1: %v", c.name, len(page), c.table, sts)
		}
		most, seq, raw := explain(t, pool, page[0])
		if most >= 10*console.PageSize {
			t.Errorf("%s: a node of the page's plan read %.0f rows (bound %d):\n%s", c.name, most, 10*console.PageSize, raw)
		}
		for _, rel := range seq {
			if strings.HasPrefix(rel, "intake_plan_change") || rel == "intake_quarantine" {
				t.Errorf("%s: Seq Scan of %s:\n%s", c.name, rel, raw)
			}
		}
	}
}
