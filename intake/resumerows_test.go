package intake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A claim whose row was never recorded (the rename's reply lost, the
// process stopped) is recorded by the next start's first poll and run by
// that same poll: the look-up of the worker's due rows begun beside the
// poll's dial is not taken as the answer once the housekeeping recorded a
// claim (resumeRows).
func TestAClaimRecordedByTheHousekeepingRunsInThatPoll(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "hk")
	site.Drop(t, "orders-h.csv", goodRows("H", 3))
	first := newRig(t, pool, "w1", site)
	if err := fault.Set("claim:after_rename=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := first.d.PollOnce(ctx, "hk"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected loss after the claim's rename", err)
	}
	fault.Set("")
	first.d.Stop()
	if got := site.Files(t, "processing"); len(got) != 1 || len(files(t, pool, "hk")) != 0 {
		t.Fatalf("processing/ holds %v with %d rows, want the claimed file without a row", got, len(files(t, pool, "hk")))
	}

	second := newRig(t, pool, "w1", site) // the same worker id, started again
	second.poll("hk")
	fs := files(t, pool, "hk")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("after the restart's first poll: %+v, want the claim recorded and archived by it", fs)
	}
	testenv.AssertExactOrders(t, pool, "hk", 3, "H")
}
