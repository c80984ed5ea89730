package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

// guardedLedger is a ledger on a connection named as intake names its
// own (application_name partner-intake/<worker>): the test database's
// transition guard (internal/testenv/transitions.go) checks every change
// of state its statements make against the transition table.
func guardedLedger(t *testing.T) (*ledger.Ledger, *pgxpool.Pool) {
	t.Helper()
	url, _ := testenv.DB(t)
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	migrations.SetSearchPath(pc.ConnConfig)
	pc.ConnConfig.RuntimeParams["application_name"] = ledger.AppName("w1")
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	return ledger.New(pool, time.Minute), pool
}

// ledgerRig drives files of one partner through the ledger's exported
// statements, as the pipeline, the reconciler and the ops commands call
// them.
type ledgerRig struct {
	t    *testing.T
	l    *ledger.Ledger
	pool *pgxpool.Pool
	n    int
}

const ltPartner = "lt"

func (r *ledgerRig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// claim records a fresh claim: "" -> claimed.
func (r *ledgerRig) claim() *ledger.Intake {
	r.t.Helper()
	r.n++
	name := fmt.Sprintf("orders-%d.csv", r.n)
	in := &ledger.Intake{Partner: ltPartner, Feed: "orders", RemoteName: name, ClaimedPath: "/processing/w1/" + name, ListedSize: 10, Worker: "w1"}
	r.must(r.l.InsertClaim(context.Background(), in))
	return in
}

// spool records a claimed file's bytes: claimed -> spooled.
func (r *ledgerRig) spool(in *ledger.Intake) {
	r.t.Helper()
	sha := fmt.Sprintf("%064x", in.ID)
	moved, err := r.l.SetSpooled(context.Background(), []ledger.Spooled{{In: in, SHA256: sha, Size: 10, DataSHA256: sha, DataSize: 10, BatchID: fmt.Sprintf("batch-%d", in.ID)}})
	r.must(err)
	if _, ok := moved[in.ID]; !ok {
		r.t.Fatalf("intake %d was not spooled", in.ID)
	}
}

// plan plans a spooled file of no rows: spooled -> next.
func (r *ledgerRig) plan(in *ledger.Intake, next ledger.State) {
	r.t.Helper()
	r.must(ledger.Plan(context.Background(), r.pool, in, next, 0, 0, "feed-sha"))
	in.State = next
}

// finish ends a file from the state it is in (ledger.Finish).
func (r *ledgerRig) finish(in *ledger.Intake, to ledger.State, reason reason.Code) {
	r.t.Helper()
	r.must(r.l.Finish(context.Background(), in, in.State, to, reason))
}

// reach is a fresh file in state s, brought there by the ledger's
// statements along the pipeline's usual path.
func (r *ledgerRig) reach(s ledger.State) *ledger.Intake {
	r.t.Helper()
	ctx := context.Background()
	var in *ledger.Intake
	switch s {
	case ledger.StateClaimed:
		return r.claim()
	case ledger.StateSpooled:
		in = r.claim()
		r.spool(in)
	case ledger.StateApplying, ledger.StateAwaitingApproval:
		in = r.reach(ledger.StateSpooled)
		r.plan(in, s)
	case ledger.StateApplied:
		in = r.reach(ledger.StateApplying)
		r.must(r.l.MarkApplied(ctx, in))
	case ledger.StateOutcomeUnknown:
		in = r.reach(ledger.StateApplying)
		_, _, err := r.l.MarkUnknown(ctx, in, "commit: no answer", time.Second, time.Minute, 5, time.Hour)
		r.must(err)
	case ledger.StateArchived:
		in = r.reach(ledger.StateApplied)
		r.finish(in, ledger.StateArchived, "")
	case ledger.StateQuarantined:
		in = r.reach(ledger.StateSpooled)
		r.finish(in, ledger.StateQuarantined, reason.RejectRate)
	case ledger.StateFailedTerminal:
		in = r.reach(ledger.StateSpooled)
		r.finish(in, ledger.StateFailedTerminal, reason.TargetError)
	default:
		r.t.Fatalf("no path to state %s", s)
	}
	return in
}

// state is the file's state as the ledger holds it.
func (r *ledgerRig) state(in *ledger.Intake) ledger.State {
	r.t.Helper()
	got, err := r.l.Get(context.Background(), ltPartner, in.ID)
	r.must(err)
	if got == nil {
		r.t.Fatalf("intake %d: no row", in.ID)
	}
	return got.State
}

// inTx runs fn in a transaction of the rig's pool, as the pipeline runs
// the statements that take its pgx.Tx.
func (r *ledgerRig) inTx(fn func(ctx context.Context, tx pgx.Tx) error) {
	r.t.Helper()
	r.must(pgx.BeginFunc(context.Background(), r.pool, func(tx pgx.Tx) error { return fn(context.Background(), tx) }))
}

// reopen sends a held file back as next (an ops release).
func (r *ledgerRig) reopen(in *ledger.Intake, next ledger.State) {
	r.t.Helper()
	r.inTx(func(ctx context.Context, tx pgx.Tx) error {
		if err := ledger.AuditDecision(ctx, tx, in.ID, in.Partner, "", "alice", "checked", "release", ""); err != nil {
			return err
		}
		ok, err := ledger.Reopen(ctx, tx, in.ID, next, "", "/quarantine/"+in.RemoteName, "")
		if err == nil && !ok {
			err = fmt.Errorf("intake %d: not held", in.ID)
		}
		return err
	})
}

// discard closes a held file for good (an ops discard).
func (r *ledgerRig) discard(in *ledger.Intake) {
	r.t.Helper()
	r.inTx(func(ctx context.Context, tx pgx.Tx) error {
		if err := ledger.AuditDecision(ctx, tx, in.ID, in.Partner, "", "alice", "not wanted", "discard", ""); err != nil {
			return err
		}
		ok, err := ledger.CloseHeld(ctx, tx, in.ID, "w1")
		if err == nil && !ok {
			err = fmt.Errorf("intake %d: not held", in.ID)
		}
		return err
	})
}

// Every transition of the table is taken by a statement of the ledger:
// each case below starts from a file the ledger's own statements brought
// into the transition's from state, runs the statement the pipeline, the
// reconciler or an ops command runs for that change, and reads the state
// the row is in. The statements run on a connection the test database's
// transition guard checks, so each is also held to the table; and the
// cases cover the table exactly (a transition added to the table without
// a statement taking it, or a case for one the table does not list,
// fails here).
func TestEveryTransitionIsTakenByALedgerStatement(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	const (
		claimed   = ledger.StateClaimed
		spooled   = ledger.StateSpooled
		applying  = ledger.StateApplying
		applied   = ledger.StateApplied
		unknown   = ledger.StateOutcomeUnknown
		awaiting  = ledger.StateAwaitingApproval
		archived  = ledger.StateArchived
		duplicate = ledger.StateDuplicate
		putBack   = ledger.StatePutBack
		held      = ledger.StateQuarantined
		failed    = ledger.StateFailedTerminal
		discarded = ledger.StateDiscarded
	)
	finishAs := func(to ledger.State, reason reason.Code) func(in *ledger.Intake) *ledger.Intake {
		return func(in *ledger.Intake) *ledger.Intake { r.finish(in, to, reason); return in }
	}
	cases := []struct {
		from, to  ledger.State
		statement string
		// take makes the change on a file in from (nil for a first
		// state) and returns the file it changed.
		take func(in *ledger.Intake) *ledger.Intake
	}{
		{"", claimed, "InsertClaim", func(*ledger.Intake) *ledger.Intake { return r.claim() }},
		{"", spooled, "InsertReplay", func(*ledger.Intake) *ledger.Intake {
			orig := r.reach(archived)
			in, err := l.InsertReplay(ctx, orig, "/processing/w1/replay-"+orig.RemoteName, "w1", orig.ID, "", "req-replay", "alice", "resend", false)
			r.must(err)
			return in
		}},

		{claimed, spooled, "SetSpooled", func(in *ledger.Intake) *ledger.Intake { r.spool(in); return in }},
		{claimed, duplicate, "Finish", finishAs(duplicate, reason.Duplicate)},
		{claimed, held, "Finish", finishAs(held, reason.ManifestMismatch)},
		{claimed, failed, "Finish", finishAs(failed, reason.RemoteLost)},
		{claimed, putBack, "MarkPutBack", func(in *ledger.Intake) *ledger.Intake { r.must(l.MarkPutBack(ctx, in)); return in }},

		{spooled, applying, "Plan", func(in *ledger.Intake) *ledger.Intake { r.plan(in, applying); return in }},
		{spooled, awaiting, "Plan", func(in *ledger.Intake) *ledger.Intake { r.plan(in, awaiting); return in }},
		{spooled, applied, "AppliedGroup", func(in *ledger.Intake) *ledger.Intake {
			r.inTx(func(ctx context.Context, tx pgx.Tx) error {
				n, err := l.AppliedGroup(ctx, tx, []ledger.GroupFile{{In: in, First: 2, Last: 2, Applied: 1}}, "feed-sha")
				if err == nil && n != 1 {
					err = fmt.Errorf("%d files of the group applied, want 1", n)
				}
				return err
			})
			return in
		}},
		{spooled, duplicate, "Finish", finishAs(duplicate, reason.Duplicate)},
		{spooled, archived, "Finish", finishAs(archived, reason.Superseded)},
		{spooled, held, "Finish", finishAs(held, reason.BatchConflict)},
		{spooled, failed, "Finish", finishAs(failed, reason.TargetError)},

		{applying, spooled, "Replan", func(in *ledger.Intake) *ledger.Intake {
			r.must(ledger.Replan(ctx, pool, in))
			return in
		}},
		{applying, applied, "MarkApplied", func(in *ledger.Intake) *ledger.Intake { r.must(l.MarkApplied(ctx, in)); return in }},
		{applying, unknown, "MarkUnknown", func(in *ledger.Intake) *ledger.Intake {
			_, _, err := l.MarkUnknown(ctx, in, "commit: no answer", time.Second, time.Minute, 5, time.Hour)
			r.must(err)
			return in
		}},
		{applying, awaiting, "Rewait", func(in *ledger.Intake) *ledger.Intake {
			r.inTx(func(ctx context.Context, tx pgx.Tx) error { return ledger.Rewait(ctx, tx, in) })
			return in
		}},
		{applying, archived, "Finish", finishAs(archived, reason.Superseded)},
		{applying, held, "Finish", finishAs(held, reason.RejectRate)},
		{applying, failed, "Finish", finishAs(failed, reason.RetriesExhausted)},

		{unknown, applying, "ResolveUnknown", func(in *ledger.Intake) *ledger.Intake {
			_, err := l.ResolveUnknown(ctx, in)
			r.must(err)
			return in
		}},

		{applied, archived, "Finish", finishAs(archived, "")},
		{applied, duplicate, "Finish", finishAs(duplicate, reason.Duplicate)},
		{applied, held, "Finish", finishAs(held, reason.ChangedAfterClaim)},
		{applied, failed, "Finish", finishAs(failed, reason.TargetError)},

		// an ops decision (Reject here; Approve is the same statement
		// with the plan's hash, which only a plan recorded against a
		// target has: intake's approval tests take it). No statement of
		// the owner's moves a file out of awaiting_approval.
		{awaiting, spooled, "Reject", func(in *ledger.Intake) *ledger.Intake {
			r.must(l.Reject(ctx, ledger.PlanDecision{IntakeID: in.ID, Partners: []string{ltPartner}, Actor: "alice", Reason: "too many deletes"}))
			return in
		}},

		{held, claimed, "Reopen", func(in *ledger.Intake) *ledger.Intake { r.reopen(in, claimed); return in }},
		{held, spooled, "Reopen", func(in *ledger.Intake) *ledger.Intake { r.reopen(in, spooled); return in }},
		{held, discarded, "CloseHeld", func(in *ledger.Intake) *ledger.Intake { r.discard(in); return in }},
		{failed, claimed, "Reopen", func(in *ledger.Intake) *ledger.Intake { r.reopen(in, claimed); return in }},
		{failed, spooled, "Reopen", func(in *ledger.Intake) *ledger.Intake { r.reopen(in, spooled); return in }},
		{failed, discarded, "CloseHeld", func(in *ledger.Intake) *ledger.Intake { r.discard(in); return in }},
	}

	type pair struct{ from, to ledger.State }
	table := map[pair]bool{}
	for _, tr := range ledger.Transitions() {
		table[pair{tr.From, tr.To}] = true
	}
	taken := map[pair]bool{}
	for _, c := range cases {
		name := fmt.Sprintf("%s->%s by %s", c.from, c.to, c.statement)
		if c.from == "" {
			name = fmt.Sprintf("first %s by %s", c.to, c.statement)
		}
		t.Run(name, func(t *testing.T) {
			r.t = t
			defer func() { r.t = nil }()
			if !table[pair{c.from, c.to}] {
				t.Fatalf("%s takes a transition the table does not list", c.statement)
			}
			var in *ledger.Intake
			if c.from != "" {
				in = r.reach(c.from)
				if got := r.state(in); got != c.from {
					t.Fatalf("the file is %s, want %s before the statement", got, c.from)
				}
			}
			out := c.take(in)
			if got := r.state(out); got != c.to {
				t.Fatalf("%s left the file %s, want %s", c.statement, got, c.to)
			}
			if in != nil && out.ID != in.ID {
				t.Fatalf("%s changed intake %d, not %d", c.statement, out.ID, in.ID)
			}
			taken[pair{c.from, c.to}] = true
		})
	}
	r.t = t
	for _, tr := range ledger.Transitions() {
		if !taken[pair{tr.From, tr.To}] {
			t.Errorf("no ledger statement here takes %q -> %q (by %v)", tr.From, tr.To, tr.By)
		}
	}
}

// A ledger statement that would take a transition the table does not
// list is refused by the test database's guard, and the row stays as it
// was: Finish, asked to hold a file already archived, and Reopen, asked
// to send a held file straight back to applying.
func TestAStatementTakingATransitionOutsideTheTableIsRefused(t *testing.T) {
	l, pool := guardedLedger(t)
	r := &ledgerRig{t: t, l: l, pool: pool}
	ctx := context.Background()
	refused := func(err error, from, to ledger.State) {
		t.Helper()
		want := fmt.Sprintf(`from state "%s" to "%s", which the ledger's transition table does not list`, from, to)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s -> %s: %v, want it refused by the guard", from, to, err)
		}
	}

	// Finish checks the table itself before its statement goes out: a
	// held state from a finished one, and put_back from any state but
	// claimed (a file is put back only before its bytes are spooled;
	// after, a change after its claim holds it)
	for _, c := range []struct{ from, to ledger.State }{
		{ledger.StateArchived, ledger.StateQuarantined},
		{ledger.StateSpooled, ledger.StatePutBack},
		{ledger.StateApplying, ledger.StatePutBack},
		{ledger.StateApplied, ledger.StatePutBack},
	} {
		in := r.reach(c.from)
		err := l.Finish(ctx, in, c.from, c.to, reason.ChangedAfterClaim)
		if want := fmt.Sprintf("%s -> %s is not an owner's transition", c.from, c.to); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Finish %s -> %s: %v, want it refused", c.from, c.to, err)
		}
		if got := r.state(in); got != c.from {
			t.Fatalf("the file is %s after the refused Finish, want %s", got, c.from)
		}
		if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_quarantine WHERE intake_id = $1`, in.ID); n != 0 {
			t.Fatalf("%d quarantine records of the refused statement", n)
		}
	}
	// the database's guard refuses what a statement would take outside
	// the table: a release straight back to applying

	h := r.reach(ledger.StateQuarantined)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ledger.AuditDecision(ctx, tx, h.ID, h.Partner, "", "alice", "checked", "release", ""); err != nil {
			return err
		}
		_, err := ledger.Reopen(ctx, tx, h.ID, ledger.StateApplying, "", "/quarantine/"+h.RemoteName, "")
		return err
	})
	refused(err, ledger.StateQuarantined, ledger.StateApplying)
	if got := r.state(h); got != ledger.StateQuarantined {
		t.Fatalf("the held file is %s after the refused release", got)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1 AND action = 'release'`, h.ID); n != 0 {
		t.Fatalf("the refused release left %d audit rows", n)
	}
}
