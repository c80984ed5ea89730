package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// OrdersHeader is the header of files for OrdersFeed.
const OrdersHeader = "order_id,email,amount,status,placed_at,qty\n"

// OrdersCSV is a valid file of n rows for OrdersFeed, keys <prefix>-1..n.
func OrdersCSV(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(OrdersHeader)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s-%d,c%d@example.com,%d.%02d,paid,2026-11-0%dT10:00:00Z,%d\n", prefix, i, i, i*10, i%100, 1+i%9, i)
	}
	return b.String()
}

// FileRow is a file of the ledger as the tests look at it.
type FileRow struct {
	ID                                         int64
	Name, State, Reason, Batch, Worker         string
	Total, Applied, Unchanged, Rejected, Confl int64
	Chunks                                     int64
	Archive, Receipt, Rejects                  string
}

// Files lists the partner's files in id order, read through the
// ledger.
func Files(t testing.TB, pool *pgxpool.Pool, partner string) []FileRow {
	t.Helper()
	ins, err := ledger.New(pool, 0).Files(context.Background(), partner)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]FileRow, 0, len(ins))
	for _, in := range ins {
		out = append(out, FileRow{ID: in.ID, Name: in.RemoteName, State: string(in.State), Reason: string(in.Reason),
			Batch: in.BatchID, Worker: in.Worker, Total: in.RowsTotal, Applied: in.RowsApplied, Unchanged: in.RowsUnchanged,
			Rejected: in.RowsRejected, Confl: in.RowsConflict, Chunks: int64(in.ChunksDone),
			Archive: in.ArchivePath, Receipt: in.ReceiptPath, Rejects: in.RejectsPath})
	}
	return out
}

// Count runs a count query.
func Count(t testing.TB, pool *pgxpool.Pool, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Strings runs a query of one text column and returns its values.
func Strings(t testing.TB, pool *pgxpool.Pool, q string, args ...any) []string {
	t.Helper()
	rs, err := pool.Query(context.Background(), q, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// AssertExactOrders checks that the partner's target rows are exactly the
// rows of OrdersCSV(prefix, n) for each prefix: none missing, none extra,
// every value as in the file.
func AssertExactOrders(t testing.TB, pool *pgxpool.Pool, partner string, n int, prefixes ...string) {
	t.Helper()
	want := int64(n * len(prefixes))
	if got := Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, partner); got != want {
		t.Fatalf("target holds %d rows for %s, want %d", got, partner, want)
	}
	// every row's values derive from its key: check them all in one query
	bad := Count(t, pool, `SELECT count(*) FROM orders o,
		LATERAL (SELECT split_part(o.order_id, '-', 2)::int AS i) k
		WHERE o.partner_id = $1 AND (o.email <> 'c' || k.i || '@example.com'
		   OR o.amount <> (k.i * 10 + (k.i % 100) / 100.0) OR o.qty <> k.i OR o.status <> 'paid')`, partner)
	if bad != 0 {
		t.Fatalf("%d target rows of %s differ from the file", bad, partner)
	}
	for _, p := range prefixes {
		if got := Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1 AND order_id LIKE $2`, partner, p+"-%"); got != int64(n) {
			t.Fatalf("%d rows with prefix %s, want %d", got, p, n)
		}
	}
}
