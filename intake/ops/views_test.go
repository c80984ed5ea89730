package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Text a partner or a site chose, with what a terminal acts on (ESC
// sequences that recolour, clear the screen or set the title; a
// bidirectional override): the views return it as stored, byte for byte;
// only cmd/intake escapes it, when it prints (internal/inert).
const (
	evilName   = "orders-\x1b[31mred\x1b[0m-\u202egpj.csv"
	evilError  = "ssh: disconnect: \x1b]0;owned\x07 from site"
	evilReason = "checked \x1b[2J by hand"
	evilHTTP   = "HTTP 500: \x1b[1Aforged line"
)

// opsSeed is what seedOps recorded.
type opsSeed struct {
	claimed, applying, awaiting, heldOpen, heldDecided, archived, other *ledger.Intake
}

// seedOps records, through the ledger's statements, files of partner oa
// in each state the views show (their names chosen by the partner), a
// poll that failed with a site's message, a plan awaiting approval, a
// discard decided by ops, a held file of partner oc, and dead webhook
// deliveries of both; partner ob has nothing.
func seedOps(t *testing.T, pool *pgxpool.Pool) opsSeed {
	t.Helper()
	ctx := context.Background()
	l := ledger.New(pool, time.Minute)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	claim := func(partner, name string) *ledger.Intake {
		t.Helper()
		n++
		in := &ledger.Intake{Partner: partner, Feed: "orders", RemoteName: name, ClaimedPath: fmt.Sprintf("/processing/w1/%d-%s", n, name), ListedSize: 10, Worker: "w1"}
		must(l.InsertClaim(ctx, in))
		return in
	}
	spooled := func(partner, name string) *ledger.Intake {
		t.Helper()
		in := claim(partner, name)
		sha := fmt.Sprintf("%064x", in.ID)
		moved, err := l.SetSpooled(ctx, []ledger.Spooled{{In: in, SHA256: sha, Size: 100, DataSHA256: sha, DataSize: 100, BatchID: fmt.Sprintf("batch-%d", in.ID)}})
		must(err)
		if _, ok := moved[in.ID]; !ok {
			t.Fatalf("intake %d was not spooled", in.ID)
		}
		return in
	}
	held := func(partner, name string) *ledger.Intake {
		t.Helper()
		in := spooled(partner, name)
		in.ArchivePath = "/quarantine/" + name
		must(l.Finish(ctx, in, ledger.StateSpooled, ledger.StateQuarantined, reason.RejectRate))
		return in
	}
	var s opsSeed
	s.claimed = claim("oa", "orders-1.csv")
	s.applying = spooled("oa", "orders-2.csv")
	must(ledger.Plan(ctx, pool, s.applying, ledger.StateApplying, 5, 1, "feed-sha"))
	s.awaiting = spooled("oa", evilName)
	must(ledger.Plan(ctx, pool, s.awaiting, ledger.StateAwaitingApproval, 3, 0, "feed-sha"))
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ledger.RecordPlan(ctx, tx, s.awaiting, ledger.PlanRecord{Hash: "plan-h1", Counts: json.RawMessage(`{"creates": 3}`),
			Wait: true, Why: "approval.always"})
	}))
	s.heldDecided = held("oa", "orders-3.csv")
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := ledger.AuditDecision(ctx, tx, s.heldDecided.ID, "oa", "req-discard", "alice", evilReason, "discard", ""); err != nil {
			return err
		}
		if ok, err := ledger.CloseHeld(ctx, tx, s.heldDecided.ID, "ops/w1"); err != nil || !ok {
			return errors.Join(err, errors.New("not held"))
		}
		return ledger.MarkDecided(ctx, tx, s.heldDecided.ID, "discarded", "alice", "discard")
	}))
	s.heldOpen = held("oa", evilName)
	s.archived = spooled("oa", "orders-4.csv")
	must(ledger.Plan(ctx, pool, s.archived, ledger.StateApplying, 0, 0, "feed-sha"))
	must(l.MarkApplied(ctx, s.archived))
	must(l.Finish(ctx, s.archived, ledger.StateApplied, ledger.StateArchived, ""))
	s.other = held("oc", "orders-9.csv")
	must(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ledger.AuditDecision(ctx, tx, s.other.ID, "oc", "req-oc", "bob", "other partner", "release", "")
	}))

	must(l.RecordPolls(ctx, "w1", []ledger.PollRecord{
		{Partner: "oa", OKAt: time.Now().Add(-time.Minute), Ready: 4, ErrAt: time.Now(), Err: evilError},
	}))

	// every event of oa and oc is routed to one endpoint, whose every
	// delivery fails for good (a budget of nothing)
	_, err := l.FanOut(ctx, 100, func(ledger.OutboxEvent) []ledger.Endpoint { return []ledger.Endpoint{{ID: "hook-1"}} })
	must(err)
	ds, err := l.ClaimDeliveries(ctx, "w1", time.Minute, 100)
	must(err)
	for _, d := range ds {
		dead, err := l.FailDelivery(ctx, d, "w1", 500, evilHTTP, time.Second, 0)
		must(err)
		if !dead {
			t.Fatalf("delivery %d/%s not dead with no budget", d.EventID, d.EndpointID)
		}
	}
	return s
}

// `intake status` reads, per partner asked for, its files by state, its
// open quarantine, the files applying and how far they got, its last
// polls (a site's message as the site sent it) and the plans awaiting a
// decision; a partner with nothing has an empty row, and a partner not
// asked for is not read.
func TestStatusViewReadsEachPartnersFilesPollsAndWaitingPlans(t *testing.T) {
	_, pool := testenv.DB(t)
	s := seedOps(t, pool)
	rows, err := ops.Status(context.Background(), pool, []string{"oa", "ob"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Partner != "oa" || rows[1].Partner != "ob" {
		t.Fatalf("rows %#v, want oa then ob", rows)
	}
	oa, ob := rows[0], rows[1]
	wantStates := map[string]int64{"claimed": 1, "applying": 1, "awaiting_approval": 1, "quarantined": 1, "discarded": 1, "archived": 1}
	if fmt.Sprint(oa.ByState) != fmt.Sprint(wantStates) {
		t.Errorf("oa by state %v, want %v", oa.ByState, wantStates)
	}
	if oa.QuarantineOpen != 1 {
		t.Errorf("oa's open quarantine %d, want 1", oa.QuarantineOpen)
	}
	if len(oa.Inflight) != 1 || oa.Inflight[0].IntakeID != s.applying.ID || oa.Inflight[0].Worker != "w1" ||
		oa.Inflight[0].Rows != 4 || oa.Inflight[0].RowsDone != 0 || oa.Inflight[0].Bytes != 100 {
		t.Errorf("oa in flight %#v, want intake %d: 4 rows to apply (5 less 1 rejected), none done, 100 bytes", oa.Inflight, s.applying.ID)
	}
	if oa.InflightTotal != 4 || oa.InflightDone != 0 {
		t.Errorf("oa in flight totals %d/%d, want 0/4", oa.InflightDone, oa.InflightTotal)
	}
	if oa.LastOK == nil || oa.LastError == nil || oa.ReadyFiles != 4 || oa.LastErrorText != evilError {
		t.Errorf("oa's polls: ok %v, error %v %q, ready %d; want both, the site's message as sent, 4 ready",
			oa.LastOK, oa.LastError, oa.LastErrorText, oa.ReadyFiles)
	}
	if len(oa.Awaiting) != 1 || oa.Awaiting[0].IntakeID != s.awaiting.ID || oa.Awaiting[0].PlanHash != "plan-h1" ||
		oa.Awaiting[0].Reason != string(reason.AwaitingApproval) {
		t.Errorf("oa awaiting %#v, want intake %d with plan-h1", oa.Awaiting, s.awaiting.ID)
	}
	if len(ob.ByState) != 0 || ob.LastOK != nil || ob.LastError != nil || len(ob.Inflight) != 0 || len(ob.Awaiting) != 0 || ob.QuarantineOpen != 0 {
		t.Errorf("ob, which has nothing: %#v", ob)
	}
}

// `intake quarantine list` and `show` (the same view) read the held files of the
// partners in scope, newest first, open ones only when asked, with the
// partner's file name and the decision as stored.
func TestQuarantineViewListsTheHeldFilesInScope(t *testing.T) {
	_, pool := testenv.DB(t)
	s := seedOps(t, pool)
	for _, tc := range []struct {
		name     string
		partners []string
		openOnly bool
		want     []int64
	}{
		{"every held file of oa, newest first", []string{"oa"}, false, []int64{s.heldOpen.ID, s.heldDecided.ID}},
		{"the open ones", []string{"oa"}, true, []int64{s.heldOpen.ID}},
		{"two partners", []string{"oa", "oc"}, true, []int64{s.other.ID, s.heldOpen.ID}},
		{"a partner with none", []string{"ob"}, false, nil},
		{"no partner in scope", nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, err := ops.ListQuarantine(context.Background(), pool, tc.partners, tc.openOnly)
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, q := range items {
				got = append(got, q.IntakeID)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("listed %v, want %v", got, tc.want)
			}
		})
	}
	items, err := ops.ListQuarantine(context.Background(), pool, []string{"oa"}, false)
	if err != nil {
		t.Fatal(err)
	}
	open, decided := items[0], items[1]
	if open.FileName != evilName || open.Path != "/quarantine/"+evilName || open.State != "open" || open.IntakeStat != "quarantined" ||
		open.Reason != reason.RejectRate || open.DecidedAt != nil || open.BatchID != fmt.Sprintf("batch-%d", s.heldOpen.ID) {
		t.Errorf("the open held file: %#v (its name must be as the partner wrote it)", open)
	}
	if decided.State != "discarded" || decided.IntakeStat != "discarded" || decided.DecidedAt == nil || decided.DecidedBy != "alice" || decided.Decision != "discard" {
		t.Errorf("the discarded file: %#v", decided)
	}
}

// `intake plan show` reads a file's plan when the file is of a partner in
// scope (nil otherwise, as for no such file), the partner's file name as
// stored.
func TestPlanViewShowsAPlanInScope(t *testing.T) {
	_, pool := testenv.DB(t)
	s := seedOps(t, pool)
	for _, tc := range []struct {
		name     string
		id       int64
		partners []string
		found    bool
	}{
		{"a waiting plan", s.awaiting.ID, []string{"oa"}, true},
		{"a file of another partner", s.awaiting.ID, []string{"oc"}, false},
		{"no such file", s.other.ID + 100, []string{"oa", "oc"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, _, err := ops.PlanPage(context.Background(), pool, tc.id, tc.partners, ledger.ChangeFilter{}, 0, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if (v != nil) != tc.found {
				t.Fatalf("plan %#v, want found %v", v, tc.found)
			}
		})
	}
	v, _, err := ops.PlanPage(context.Background(), pool, s.awaiting.ID, []string{"oa"}, ledger.ChangeFilter{}, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var counts map[string]int
	if err := json.Unmarshal(v.Counts, &counts); err != nil {
		t.Fatal(err)
	}
	if v.File != evilName || v.State != "awaiting_approval" || v.Hash != "plan-h1" || v.ApprovedHash != "" || v.Decision != "" ||
		v.RowsTotal != 3 || counts["creates"] != 3 || v.PlannedAt == nil || v.FeedSHA != "feed-sha" {
		t.Errorf("plan %#v", v)
	}
}

// `intake audit` reads the audit rows of the partners in scope, newest
// first, at most limit, or the one row of a request; an operator's reason
// as typed.
func TestAuditViewReadsTheRowsInScope(t *testing.T) {
	_, pool := testenv.DB(t)
	s := seedOps(t, pool)
	for _, tc := range []struct {
		name     string
		partners []string
		request  string
		limit    int
		want     []string // actor:action:intake
	}{
		{"oa's rows, newest first", []string{"oa"}, "", 10, []string{
			fmt.Sprintf("alice:discard:%d", s.heldDecided.ID), fmt.Sprintf("intake:await_approval:%d", s.awaiting.ID)}},
		{"at most one", []string{"oa"}, "", 1, []string{fmt.Sprintf("alice:discard:%d", s.heldDecided.ID)}},
		{"one request", []string{"oa", "oc"}, "req-oc", 10, []string{fmt.Sprintf("bob:release:%d", s.other.ID)}},
		{"a request of a partner out of scope", []string{"oa"}, "req-oc", 10, nil},
		{"a partner with none", []string{"ob"}, "", 10, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es, err := ops.Audit(context.Background(), pool, tc.partners, tc.request, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range es {
				got = append(got, fmt.Sprintf("%s:%s:%d", e.Actor, e.Action, e.IntakeID))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("audit %v, want %v", got, tc.want)
			}
		})
	}
	es, err := ops.Audit(context.Background(), pool, []string{"oa"}, "req-discard", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Reason != evilReason || es[0].Request != "req-discard" || es[0].Partner != "oa" || es[0].DBUser == "" {
		t.Errorf("the discard's audit row %#v, want the reason as typed, its request id and login role", es)
	}
}

// `intake notify dead` reads the dead deliveries of the partners in
// scope, oldest death first, at most limit, with the endpoint's answer
// as it came.
func TestDeadDeliveriesViewReadsThePartnersInScope(t *testing.T) {
	_, pool := testenv.DB(t)
	seedOps(t, pool)
	events := func(partner string) int {
		return int(testenv.Count(t, pool, `SELECT count(*) FROM intake_outbox WHERE partner_id = $1`, partner))
	}
	for _, tc := range []struct {
		name     string
		partners []string
		limit    int
		want     int
	}{
		{"every one of oa", []string{"oa"}, 100, events("oa")},
		{"at most one", []string{"oa"}, 1, 1},
		{"two partners", []string{"oa", "oc"}, 100, events("oa") + events("oc")},
		{"a partner with none", []string{"ob"}, 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := ops.DeadDeliveries(context.Background(), pool, tc.partners, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != tc.want {
				t.Fatalf("%d dead deliveries, want %d", len(ds), tc.want)
			}
			in := map[string]bool{}
			for _, p := range tc.partners {
				in[p] = true
			}
			for i, d := range ds {
				if !in[d.Partner] || d.EndpointID != "hook-1" || d.Attempts != 1 || d.LastStatus != 500 || d.LastError != evilHTTP {
					t.Errorf("delivery %#v, want one of %v to hook-1, one attempt, 500 and the answer as it came", d, tc.partners)
				}
				if i > 0 && d.DeadAt.Before(ds[i-1].DeadAt) {
					t.Errorf("delivery %d died before the one listed before it", d.EventID)
				}
			}
		})
	}
	if events("oa") < 3 {
		t.Fatalf("oa has %d events, want at least its two held files' and its waiting plan's", events("oa"))
	}
}
