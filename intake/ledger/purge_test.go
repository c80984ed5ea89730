package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// Retention lets go only what no decision still needs: a file failed for
// good (failed_terminal) long ago but held for ops (its quarantine record
// open) keeps its row issues, which ops review, and its spooled bytes,
// which a release applies; once ops discarded it, both go like any
// finished file's.
func TestRetentionKeepsWhatAHeldFileStillNeeds(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, reason,
		    worker_id, lease_until, content_sha256, finished_at)
		VALUES ('acme', 'orders', 'orders-1.csv', 'quarantine/1.orders-1.csv', 10, 'failed_terminal', 'target_refused',
		    'w1', pg_catalog.now(), 'ab12', pg_catalog.now() - interval '90 days') RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO intake_quarantine (intake_id, partner_id, reason, content_sha256, path) VALUES ($1, 'acme', 'target_refused', 'ab12', 'quarantine/1.orders-1.csv')`,
		`INSERT INTO intake_row_issue (intake_id, partner_id, line, reason, outcome) VALUES ($1, 'acme', 2, 'target_refused', 'rejected')`,
	} {
		if _, err := pool.Exec(ctx, q, id); err != nil {
			t.Fatal(err)
		}
	}
	l := ledger.New(pool, time.Minute)
	cutoff := time.Now().Add(-30 * 24 * time.Hour)
	if n, err := l.PurgeRowIssues(ctx, "acme", cutoff); err != nil || n != 0 {
		t.Fatalf("purged %d row issues (%v) of a file held for ops, want none", n, err)
	}
	if in, err := l.SpoolInUse(ctx, "acme", []string{"ab12"}, cutoff); err != nil || !in["ab12"] {
		t.Fatalf("the held file's spooled bytes are not in use (%v): retention would delete what a release applies", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE intake_quarantine SET state = 'discarded', decided_at = pg_catalog.now() WHERE intake_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := l.PurgeRowIssues(ctx, "acme", cutoff); err != nil || n != 1 {
		t.Fatalf("purged %d row issues (%v) of a decided file, want its one", n, err)
	}
	if in, err := l.SpoolInUse(ctx, "acme", []string{"ab12"}, cutoff); err != nil || in["ab12"] {
		t.Fatalf("a decided file's old spooled bytes are still in use (%v)", err)
	}
}
