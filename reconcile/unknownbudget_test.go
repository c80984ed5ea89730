package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// Row 9 and the retry budget: a file whose COMMIT reply is lost on every
// try goes outcome_unknown, is resolved from the ledger and resumed, again
// and again. Each such episode counts as an attempt, so past the budget
// the file fails for good (retries_exhausted, with its receipt) instead of
// cycling for ever; the chunks whose commits did land stay applied once
// and are what its row and receipt say.
func TestCommitReplyLostOnEveryTryEndsPastTheRetryBudget(t *testing.T) {
	const budget, chunkRows, rows = 3, 10, 200
	_, pool := testenv.DB(t)
	site := bigSite(t, "unkb", chunkRows)
	site.Drop(t, "orders-b.csv", testenv.OrdersCSV("B", rows))
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfgs := []partners.Config{site.Validated(t)}
	log := testenv.Logger(t)
	d, err := intake.New(intake.Config{WorkerID: "w1", Lease: 10 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: budget, Base: time.Millisecond, Max: time.Millisecond}},
		cfgs, pool, sp, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{}, "w1", 10*time.Second, pool, sp, cfgs, prometheus.NewRegistry(), log, d.TakenOver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Stop(); d.Stop() })
	n := &node{d: d, rec: rec, sp: sp}

	// every run of the file has the reply of its first COMMIT lost (the
	// commit landed): far more rounds than the budget would let it take
	const maxRounds = rows/chunkRows + 2
	rounds, unknown := 0, 0
	var f testenv.FileRow
	for rounds < maxRounds {
		rounds++
		// the file's backoff (a millisecond) is over: it is due now
		if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET next_attempt_at = pg_catalog.now()
			WHERE partner_id = 'unkb' AND next_attempt_at > pg_catalog.now()`); err != nil {
			t.Fatal(err)
		}
		withFault(t, "commit:reply_lost=error")
		if err := n.poll(t, "unkb"); err != nil {
			t.Fatalf("round %d, after %d outcome_unknown episodes (budget %d): %v", rounds, unknown, budget, err)
		}
		f = testenv.Files(t, pool, "unkb")[0]
		if f.State != "outcome_unknown" {
			break
		}
		unknown++
		fs := n.reconcile(t)
		if kinds(fs)[ledger.KindOutcomeUnknown] != 1 || reconcile.NeedHuman(fs) {
			t.Fatalf("round %d: findings %+v", rounds, fs)
		}
		for _, x := range fs {
			if x.Kind == ledger.KindOutcomeUnknown && strings.Contains(x.Action, "retry budget") != (unknown == budget) {
				t.Fatalf("round %d (episode %d of a budget of %d): %q", rounds, unknown, budget, x.Action)
			}
		}
	}
	if f.State != "failed_terminal" || f.Reason != string(reason.RetriesExhausted) {
		t.Fatalf("after %d rounds (%d outcome_unknown) the file is %s %s, want failed_terminal retries_exhausted", rounds, unknown, f.State, f.Reason)
	}
	if unknown != budget || rounds != budget+1 {
		t.Fatalf("the file failed after %d rounds with %d outcome_unknown, want %d episodes and then its end", rounds, unknown, budget)
	}
	// each episode's chunk landed: the ledger, the row and the target agree,
	// nothing applied twice
	want := int64(budget * chunkRows)
	if got := testenv.Count(t, pool, `SELECT count(*) FROM intake_chunk WHERE intake_id = $1`, f.ID); got != budget || f.Chunks != budget {
		t.Fatalf("ledger holds %d chunks, the row says %d, want %d", got, f.Chunks, budget)
	}
	if f.Applied != want {
		t.Fatalf("the row says %d rows applied, want %d", f.Applied, want)
	}
	testenv.AssertExactOrders(t, pool, "unkb", int(want), "B")
	if got := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'unkb' AND split_part(order_id, '-', 2)::int <= $1`, want); got != want {
		t.Fatalf("%d of the target's rows are the file's first %d lines", got, want)
	}
	if got := testenv.Count(t, pool, `SELECT attempts FROM file_intake WHERE intake_id = $1`, f.ID); got != budget {
		t.Fatalf("attempts %d, want %d", got, budget)
	}
	rc := readReceipt(t, site, f.Receipt)
	if rc.Outcome != ledger.OutcomeFailed || rc.Reason != reason.RetriesExhausted || rc.Rows.Applied != want ||
		!strings.Contains(rc.Detail, fmt.Sprintf("%d of its rows were applied", want)) {
		t.Fatalf("receipt %+v, want failed retries_exhausted with %d rows applied", rc, want)
	}
	// it stays ended: the next poll and reconciler run leave it so
	withFault(t, "commit:reply_lost=error")
	if err := n.poll(t, "unkb"); err != nil {
		t.Fatal(err)
	}
	if fs := n.reconcile(t); kinds(fs)[ledger.KindOutcomeUnknown] != 0 {
		t.Fatalf("findings %+v", fs)
	}
	if f := testenv.Files(t, pool, "unkb")[0]; f.State != "failed_terminal" || f.Chunks != budget {
		t.Fatalf("after its end: %+v", f)
	}
}
