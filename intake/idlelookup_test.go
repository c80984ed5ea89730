package intake_test

import (
	"testing"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// An idle partner's polls make no statement: once a look-up found no
// live row of this worker's and ready/ offered nothing, the next polls
// skip the look-up but every tenth. A poll that lists a file, a
// failed poll, and a file waiting for its next attempt each bring the
// look-up back, so nothing of this worker's waits behind a skipped one.
func TestAnIdlePartnerIsNotLookedUpUntilItHasFiles(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "idle")
	r := newRig(t, pool, "w1", site)
	looked := &intake.Signals(r.d).OwnedLookup
	looked.Init(t)
	// lookups polls n times and says how many of them looked up
	lookups := func(n int) int {
		t.Helper()
		looked.Clear()
		for range n {
			r.poll("idle")
		}
		got := 0
		for {
			select {
			case <-looked.C():
				got++
			default:
				return got
			}
		}
	}

	if got := lookups(1); got != 1 {
		t.Fatalf("the first poll looked up %d times, want once", got)
	}
	if got := lookups(9); got != 0 {
		t.Fatalf("nine idle polls looked up %d times, want none", got)
	}
	if got := lookups(1); got != 1 {
		t.Fatalf("the tenth idle poll since the look-up looked up %d times, want once", got)
	}
	if got := lookups(8); got != 0 {
		t.Fatalf("eight idle polls after that look-up looked up %d times, want none", got)
	}

	// a file: the poll that claims it skips the look-up (it was idle
	// before), the next one looks up again and finds nothing live
	site.Drop(t, "orders-1.csv", goodRows("I", 3))
	if got := lookups(1); got != 0 {
		t.Fatalf("the poll that found the file looked up %d times, want none", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'idle' AND state = 'archived'`); n != 1 {
		t.Fatalf("%d files archived, want 1", n)
	}
	if got := lookups(2); got != 1 {
		t.Fatalf("two polls after a claim looked up %d times, want once", got)
	}

	// a file whose poll fails part way stays this worker's, waiting: the
	// polls after it look up until it is done
	site.Drop(t, "orders-2.csv", goodRows("J", 3))
	if err := fault.Set("spool:after=error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	if err := r.d.PollOnce(t.Context(), "idle"); err == nil {
		t.Fatal("the poll with the fault armed did not fail")
	}
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() + interval '1 hour' WHERE partner_id = 'idle' AND state = 'spooled'`)
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'idle' AND state = 'spooled'`); n != 1 {
		t.Fatalf("%d files wait spooled, want 1", n)
	}
	if got := lookups(11); got != 11 {
		t.Fatalf("eleven polls while a file waits looked up %d times, want every time", got)
	}
	execArgs(t, pool, `UPDATE file_intake SET next_attempt_at = now() WHERE partner_id = 'idle'`)
	if got := lookups(1); got != 1 {
		t.Fatalf("the poll that resumes the file looked up %d times, want once", got)
	}
	if n := count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'idle' AND state = 'archived'`); n != 2 {
		t.Fatalf("%d files archived, want 2", n)
	}
	if got := lookups(3); got != 1 {
		t.Fatalf("three polls after the resume looked up %d times, want once", got)
	}
}
