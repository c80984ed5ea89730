package intake_test

import (
	"context"
	"errors"
	"testing"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// ready/ is listed beside a poll's housekeeping. When the housekeeping
// runs a file (a restart resuming its own), that listing is stale by the
// time the claims start, and ready/ is listed again: a file dropped while
// the resumed file ran is claimed in the same poll.
func TestReadyIsListedAgainAfterTheHousekeepingRanAFile(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	ctx := context.Background()

	// w1 applies a file's rows and stops before its archive
	site.Drop(t, "orders-a.csv", goodRows("A", 3))
	r0 := newRig(t, pool, "w1", site)
	if err := fault.Set("apply:after_commit=error"); err != nil {
		t.Fatal(err)
	}
	err := r0.d.PollOnce(ctx, "acme")
	fault.Set("")
	if !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("got %v, want the injected stop after the commit", err)
	}
	r0.d.Stop()
	if _, err := pool.Exec(ctx, `UPDATE file_intake SET next_attempt_at = now() WHERE partner_id = 'acme'`); err != nil {
		t.Fatal(err)
	}

	// w1 again: its first poll resumes the file (housekeeping); a file
	// dropped while that runs is claimed by the same poll. (The listing
	// made beside the housekeeping, one local READDIR, is done long
	// before the resumed file reaches its archive, where it pauses: that
	// listing did not see the file.)
	r1 := newRig(t, pool, "w1", site)
	resume := r1.pollPaused("acme", "archive:mid")
	site.Drop(t, "orders-b.csv", goodRows("B", 2))
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	fs := files(t, pool, "acme")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "archived" {
		t.Fatalf("after one poll: %+v, want the resumed file and the one dropped meanwhile archived", fs)
	}
}
