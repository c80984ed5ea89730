package intake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A group's COMMIT that never gets an answer counts as an attempt of each
// of its files, as a file's own chunk commit does. With a budget of 2 the
// group's lost COMMIT is each file's first attempt and the file's own lost
// COMMIT its second, after which it fails for good (failed_terminal,
// retries_exhausted) with nothing applied; with a budget of 1 the group's
// episode spends it, and the next run fails the files without another
// commit. Without the count the group's episode was free: attempts 0
// after it, one episode more than the budget.
func TestAGroupCommitWithoutAnswerCountsAgainstTheRetryBudget(t *testing.T) {
	for _, budget := range []int{2, 1} {
		t.Run(fmt.Sprintf("a budget of %d", budget), func(t *testing.T) {
			_, pool := testenv.DB(t)
			id := fmt.Sprintf("gunk%d", budget)
			site := testenv.NewSite(t, id)
			r := newRigCfg(t, pool, intake.Config{WorkerID: id + "-w", Lease: 30 * time.Second, SpoolMinFree: 1,
				Retry: intake.RetryPolicy{Attempts: budget, Base: time.Millisecond, Max: time.Millisecond}}, site)
			site.Drop(t, "orders-1.csv", goodRows("G1", 3))
			site.Drop(t, "orders-2.csv", goodRows("G2", 3))
			t.Cleanup(func() { fault.Set("") })
			attempts := func(f fileRow) int64 {
				return testenv.Count(t, pool, `SELECT attempts FROM file_intake WHERE intake_id = $1`, f.ID)
			}

			if err := fault.Set("commit:lost=error"); err != nil {
				t.Fatal(err)
			}
			r.poll(id) // the two small files go as one group; its COMMIT is lost
			fs := files(t, pool, id)
			if len(fs) != 2 || fault.Hits("commit:lost") != 1 {
				t.Fatalf("rows %+v after %d COMMITs, want the group's two files and one COMMIT", fs, fault.Hits("commit:lost"))
			}
			for _, f := range fs {
				if f.State != "spooled" || attempts(f) != 1 {
					t.Fatalf("intake %d is %s with %d attempts after its group's COMMIT went unanswered, want spooled with 1", f.ID, f.State, attempts(f))
				}
			}

			// Each file alone, one at a time (a fault fires once):
			// its own COMMIT is lost while budget remains, then the
			// reconciler reads the ledger and the next run ends it.
			for _, f := range fs {
				if _, err := pool.Exec(context.Background(), `UPDATE file_intake SET next_attempt_at =
					CASE WHEN intake_id = $1 THEN pg_catalog.now() ELSE pg_catalog.now() + interval '1 hour' END
					WHERE partner_id = $2 AND state = 'spooled'`, f.ID, id); err != nil {
					t.Fatal(err)
				}
				if budget > 1 {
					fault.Set("commit:lost=error")
					r.poll(id)
					got := files(t, pool, id)[f.ID-fs[0].ID]
					if got.State != "outcome_unknown" || got.Reason != string(reason.RetriesExhausted) || fault.Hits("commit:lost") != 1 {
						t.Fatalf("intake %d is %s %s after its own lost COMMIT, want outcome_unknown retries_exhausted", got.ID, got.State, got.Reason)
					}
					fault.Set("")
					reconcileAs(t, pool, id+"-w", site) // as the rig's worker: the file resumes on its next poll
				}
				r.poll(id)
				got := files(t, pool, id)[f.ID-fs[0].ID]
				if got.State != "failed_terminal" || got.Reason != string(reason.RetriesExhausted) || attempts(got) != int64(budget) {
					t.Fatalf("intake %d ended %s %s with %d attempts, want failed_terminal retries_exhausted with %d", got.ID, got.State, got.Reason, attempts(got), budget)
				}
			}
			if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = $1`, id); n != 0 {
				t.Fatalf("%d rows in the target, want none (no COMMIT landed)", n)
			}
			if q := site.Files(t, "quarantine"); len(q) < 2 {
				t.Fatalf("quarantine/ holds %v, want both files", q)
			}
		})
	}
}
