package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// PreparePoll prepares the statements a poll and its files send first by
// their very text: run afterwards (the due rows, the claim lock with an
// id, the claim's row, the batch's file, the file spooled, its end, the
// poll's record), each runs as the statement prepared ahead, and the
// connection holds no other prepared statement.
func TestPreparePollPreparesWhatAPollRuns(t *testing.T) {
	url, _ := testenv.DB(t)
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1 // one session: what was prepared on it is what runs on it
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	l := ledger.New(pool, time.Minute)
	if err := l.PreparePoll(ctx); err != nil {
		t.Fatal(err)
	}
	prepared := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement NOT LIKE '%pg_prepared_statements%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ahead := prepared()
	if ahead != 7 {
		t.Fatalf("%d statements prepared ahead, want 7", ahead)
	}

	if _, err := l.DueOwnedBy(ctx, "pp", "w1"); err != nil {
		t.Fatal(err)
	}
	lock, id, err := l.LockClaimsNext(ctx, "pp")
	if err != nil {
		t.Fatal(err)
	}
	lock.Release()
	in := &ledger.Intake{Partner: "pp", Feed: "orders", RemoteName: "orders-1.csv", ClaimedPath: "/processing/w1/orders-1.csv", ListedSize: 10, Worker: "w1"}
	if _, err := l.InsertClaimAt(ctx, in, id); err != nil {
		t.Fatal(err)
	}
	if in.ID != id {
		t.Fatalf("the claim's row has id %d, want %d, allocated with the lock", in.ID, id)
	}
	if _, err := l.BatchBoundFile(ctx, in, "1"); err != nil {
		t.Fatal(err)
	}
	sum := "3b5d3c7d207e37dceeedd301e35e2e58408ccea1c8f1d0bb9ee0e5b0cdb4d5ea"
	if _, err := l.SetSpooled(ctx, in, sum, 10, sum, 10, "1", nil); err != nil {
		t.Fatal(err)
	}
	in.ArchivePath, in.ReceiptPath = "/archive/orders-1.csv", "/reports/orders-1.1.receipt.json"
	if err := l.Finish(ctx, in, ledger.StateSpooled, ledger.StateArchived, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.RecordPolls(ctx, "w1", []ledger.PollRecord{{Partner: "pp", OKAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if n := prepared(); n != ahead {
		t.Fatalf("%d statements prepared after the poll's, want the %d prepared ahead: one ran under another text", n, ahead)
	}
}
