package ledger_test

import (
	"context"
	"regexp"
	"sort"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// quotedStates are the quoted words of a constraint's or an index's
// definition: the states it names.
func quotedStates(t *testing.T, def string) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile(`'([a-z_]+)'`).FindAllStringSubmatch(def, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return out
}

func sorted(ss []ledger.State, keep func(ledger.StateInfo) bool) []string {
	var out []string
	for _, s := range ss {
		if keep(s.Info()) {
			out = append(out, string(s))
		}
	}
	sort.Strings(out)
	return out
}

// The state table knows exactly the states the database allows, and the
// states whose rows own their claimed path are exactly those the unique
// index on the claimed path covers: a state added to one and not the
// other fails here.
func TestTheStateTableIsTheDatabasesStates(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.DB(t)
	var check, index string
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
		WHERE conname = 'file_intake_state_check'`).Scan(&check); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.pg_get_indexdef('file_intake_live_path'::pg_catalog.regclass)`).Scan(&index); err != nil {
		t.Fatal(err)
	}
	all := sorted(ledger.States(), func(ledger.StateInfo) bool { return true })
	if got := quotedStates(t, check); !equal(got, all) {
		t.Errorf("the database allows %v, the state table knows %v", got, all)
	}
	holding := sorted(ledger.States(), func(i ledger.StateInfo) bool { return i.Holding })
	if got := quotedStates(t, index); !equal(got, holding) {
		t.Errorf("one row per claimed path among %v, the state table's holding states are %v", got, holding)
	}
	for _, s := range ledger.States() {
		i := s.Info()
		switch {
		case i.Next == "" || i.Fate == "":
			t.Errorf("state %s: no mover or fate", s)
		case i.Live && !i.Holding:
			t.Errorf("state %s: live but not holding its path", s)
		case i.Live && i.Next != ledger.MoverOwner && i.Next != ledger.MoverReconciler:
			t.Errorf("state %s: live, moved on by %s", s, i.Next)
		case i.Holding && (i.InQuarantine || i.Archived):
			t.Errorf("state %s: owns its claimed path and is in quarantine/ or archive/", s)
		}
	}
	if ledger.State("nonsense").Info().Next != "" {
		t.Error("an unknown state has a mover")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The transition table speaks only of known states; every state is
// reached by some transition; a final state (moved on by nobody) has no
// way out, and every other state has one its mover may take.
func TestTheTransitionTableAgreesWithTheStateTable(t *testing.T) {
	known := map[ledger.State]bool{"": true}
	for _, s := range ledger.States() {
		known[s] = true
	}
	reached := map[ledger.State]bool{}
	out := map[ledger.State][]ledger.Transition{}
	for _, tr := range ledger.Transitions() {
		if !known[tr.From] || !known[tr.To] || tr.To == "" || len(tr.By) == 0 {
			t.Errorf("transition %+v: an unknown state, no target or nobody to take it", tr)
		}
		reached[tr.To] = true
		out[tr.From] = append(out[tr.From], tr)
	}
	for _, s := range ledger.States() {
		if !reached[s] {
			t.Errorf("no transition reaches state %s", s)
		}
		next := s.Info().Next
		if next == ledger.MoverNobody {
			if len(out[s]) > 0 {
				t.Errorf("final state %s has transitions out: %+v", s, out[s])
			}
			continue
		}
		took := false
		for _, tr := range out[s] {
			for _, by := range tr.By {
				took = took || by == next
			}
		}
		if !took {
			t.Errorf("state %s is moved on by %s, but no transition out of it is theirs", s, next)
		}
	}
}
