package pollrecord

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// TestPollOutcomesAreWrittenTogetherAsTheyHappened: outcomes noted
// between writes reach intake_partner_poll in one write, each partner's
// last success and last failure kept apart (neither clears the other's
// columns), stamped when the poll ended rather than when written; a
// write that fails keeps them for the next, merged with what came since;
// an older outcome written last never moves a row back; error texts are
// stored as valid text whatever the server sent.
func TestPollOutcomesAreWrittenTogetherAsTheyHappened(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	l := ledger.New(pool, time.Minute)
	// the recorder's clock is the test's: an outcome is stamped with its
	// reading when it is noted, an hour before the writes below, and a
	// minute passes between readings
	clock := time.Now().Add(-time.Hour)
	now := func() time.Time { return clock }
	tick := func() time.Time { clock = clock.Add(time.Minute); return clock }
	r := Recorder{now: now}
	type row struct {
		okAt, errAt *time.Time
		ready       int
		oldest      *time.Time
		errText     string
	}
	read := func(partner string) row {
		t.Helper()
		var got row
		var errText *string
		if err := pool.QueryRow(ctx, `SELECT last_ok_at, last_error_at, ready_files, oldest_ready_at, last_error
			FROM intake_partner_poll WHERE partner_id = $1 AND worker_id = 'w1'`, partner).
			Scan(&got.okAt, &got.errAt, &got.ready, &got.oldest, &errText); err != nil {
			t.Fatalf("%s: %v", partner, err)
		}
		if errText != nil {
			got.errText = *errText
		}
		return got
	}
	// at: a stored time is the noted one (written as the database's clock
	// less how long ago it was noted: within a few seconds of it)
	at := func(got *time.Time, want time.Time) bool {
		return got != nil && got.Sub(want).Abs() < 5*time.Second
	}
	write := func() {
		t.Helper()
		if err := r.write(ctx, l, "w1"); err != nil {
			t.Fatal(err)
		}
	}

	oldest := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	t0 := now()
	r.Add("a", nil, 3, oldest)
	r.Add("b", errors.New("dial: refused"), 0, time.Time{})
	t1 := tick()
	r.Add("a", errors.New("list ready: timeout"), 0, time.Time{})
	write() // an hour after the outcomes: the rows carry the noted times
	a, b := read("a"), read("b")
	if !at(a.okAt, t0) || a.ready != 3 || a.oldest == nil || !a.oldest.Equal(oldest) || a.errText != "list ready: timeout" || !at(a.errAt, t1) {
		t.Fatalf("a after its success at %s and its failure at %s: %+v", t0, t1, a)
	}
	if b.okAt != nil || b.errText != "dial: refused" || b.ready != 0 || !at(b.errAt, t0) {
		t.Fatalf("b after its failure at %s: %+v", t0, b)
	}

	// a later success of a leaves its last failure as it was; one of b
	// leaves b's
	t2 := tick()
	r.Add("a", nil, 5, time.Time{})
	r.Add("b", nil, 1, oldest)
	write()
	a2, b2 := read("a"), read("b")
	if a2.ready != 5 || a2.oldest != nil || !at(a2.okAt, t2) || a2.errText != a.errText || !a2.errAt.Equal(*a.errAt) {
		t.Fatalf("a after a later success: %+v (before: %+v)", a2, a)
	}
	if b2.okAt == nil || b2.ready != 1 || b2.errText != "dial: refused" || !b2.errAt.Equal(*b.errAt) {
		t.Fatalf("b after a success: %+v (before: %+v)", b2, b)
	}

	// a write that fails keeps its outcomes; a failure noted meanwhile is
	// the later one, and both reach the table with the next write
	r.Add("c", nil, 7, time.Time{})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.write(cancelled, l, "w1"); err == nil {
		t.Fatal("a write on a cancelled context succeeded")
	}
	r.Add("c", errors.New("claim: renamed away"), 0, time.Time{})
	write()
	if c := read("c"); c.okAt == nil || c.ready != 7 || c.errText != "claim: renamed away" {
		t.Fatalf("c after a failed write: %+v", c)
	}

	// an outcome written after a later one of the same kind (another
	// write in flight) does not move the row back
	older := Recorder{now: now}
	older.Add("d", nil, 1, time.Time{})
	older.Add("d", errors.New("list ready: old"), 0, time.Time{})
	tick() // r's outcomes noted on a later clock reading than older's
	r.Add("d", nil, 2, time.Time{})
	r.Add("d", errors.New("list ready: new"), 0, time.Time{})
	write()
	if err := older.write(ctx, l, "w1"); err != nil {
		t.Fatal(err)
	}
	if d := read("d"); d.ready != 2 || d.errText != "list ready: new" {
		t.Fatalf("d after an older outcome written last: %+v", d)
	}

	// a server's message is stored as valid text (PostgreSQL refuses
	// invalid UTF-8 and NUL), cut on a character boundary
	long := strings.Repeat("é", 300) // 600 bytes
	r.Add("e", errors.New("ssh: disconnect: \xff\x00bad"), 0, time.Time{})
	r.Add("f", errors.New(long), 0, time.Time{})
	write()
	if e := read("e"); e.errText != "ssh: disconnect: \uFFFDbad" {
		t.Fatalf("e's error text: %q", e.errText)
	}
	if f := read("f"); f.errText != strings.Repeat("é", 250) {
		t.Fatalf("f's error text: %d bytes, valid UTF-8 %v", len(f.errText), utf8.ValidString(f.errText))
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_partner_poll`); n != 6 {
		t.Fatalf("%d rows, want 6 (a to f)", n)
	}
	if err := r.write(ctx, l, "w1"); err != nil {
		t.Fatalf("a write with nothing pending: %v", err)
	}
}
