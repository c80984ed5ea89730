package ledger

import "slices"

// What each state of a file means to whoever looks at a row in it: the
// statements that take a row over, adopt a claim or judge what the site
// holds, the reconciler's findings, and what an ops command tells its
// operator about a row it leaves behind. One table; a test holds it to the
// states file_intake's CHECK constraint allows.

// Mover is who moves a row on from a state.
type Mover string

// Movers.
const (
	// MoverOwner: the worker holding the row's lease; when the lease ends,
	// a reconciler takes the row over and becomes its owner.
	MoverOwner Mover = "owner"
	// MoverReconciler: a reconciler run (outcome_unknown is resolved from
	// the chunk ledger by one, never by a blind retry).
	MoverReconciler Mover = "reconciler"
	// MoverOps: an ops decision (release, discard, approve, reject).
	MoverOps Mover = "ops"
	// MoverNobody: the state is final.
	MoverNobody Mover = "nobody"
	// MoverPoller: a poll records a claim (or adopts one without a row).
	MoverPoller Mover = "poller"
)

// StateInfo is one state's row of the table.
type StateInfo struct {
	// Live: a worker owns the row under a lease.
	Live bool
	// Holding: the row owns its claimed path on the site: no adoption or
	// second row may take the file there.
	Holding bool
	// InQuarantine: the file (or, with nothing left to move, its reason
	// file) is in quarantine/ as the state's evidence.
	InQuarantine bool
	// Archived: the file is in archive/ at the row's archive path.
	Archived bool
	// Next is who moves the row on.
	Next Mover
	// Fate says what becomes of a row left in this state, completing
	// "intake N is <state>: ".
	Fate string
}

// stateTable lists every state once, in the order a file meets them.
var stateTable = []struct {
	State State
	StateInfo
}{
	{StateClaimed, StateInfo{Live: true, Holding: true, Next: MoverOwner,
		Fate: "its owner downloads it; a reconciler takes it over when the owner's lease ends and finishes it"}},
	{StateSpooled, StateInfo{Live: true, Holding: true, Next: MoverOwner,
		Fate: "its owner applies it; a reconciler takes it over when the owner's lease ends and finishes it"}},
	{StateApplying, StateInfo{Live: true, Holding: true, Next: MoverOwner,
		Fate: "its owner goes on after the committed chunks; a reconciler takes it over when the owner's lease ends and finishes it"}},
	{StateApplied, StateInfo{Live: true, Holding: true, Next: MoverOwner,
		Fate: "its rows are committed; its owner archives it, or a reconciler when the owner's lease ends"}},
	{StateOutcomeUnknown, StateInfo{Live: true, Holding: true, Next: MoverReconciler,
		Fate: "a commit's outcome was lost; the next reconcile run reads the chunk ledger and resumes it after the chunks that are in"}},
	{StateAwaitingApproval, StateInfo{Holding: true, Next: MoverOps,
		Fate: "its plan waits for intake approve or intake reject"}},
	{StateArchived, StateInfo{Archived: true, Next: MoverNobody,
		Fate: "finished; its receipt is in the partner's reports/"}},
	{StateDuplicate, StateInfo{Archived: true, Next: MoverNobody,
		Fate: "finished as a duplicate of bytes already applied"}},
	{StatePutBack, StateInfo{Next: MoverNobody,
		Fate: "it changed after its claim and went back to ready/; a later poll takes it as a new intake"}},
	{StateQuarantined, StateInfo{InQuarantine: true, Next: MoverOps,
		Fate: "held in quarantine/ until intake quarantine release or discard"}},
	{StateFailedTerminal, StateInfo{InQuarantine: true, Next: MoverOps,
		Fate: "failed for good and held in quarantine/; intake quarantine release sends it back"}},
	{StateDiscarded, StateInfo{InQuarantine: true, Next: MoverNobody,
		Fate: "discarded; it stays in quarantine/ as evidence until retention removes it"}},
}

// States lists every state of a file.
func States() []State {
	out := make([]State, len(stateTable))
	for i, s := range stateTable {
		out[i] = s.State
	}
	return out
}

// Info is what s means; the zero StateInfo (no mover) for a state the
// table does not know.
func (s State) Info() StateInfo {
	for _, t := range stateTable {
		if t.State == s {
			return t.StateInfo
		}
	}
	return StateInfo{}
}

// statesWhere lists, as SQL parameters, the states whose row matches.
func statesWhere(match func(StateInfo) bool) []string {
	var out []string
	for _, s := range stateTable {
		if match(s.StateInfo) {
			out = append(out, string(s.State))
		}
	}
	return out
}

// Transition is one change of a row's state that a statement may make,
// and who may make it. From "" is a row's first state (its INSERT).
type Transition struct {
	From, To State
	By       []Mover
}

// transitions are every change of state the ledger's statements make. A
// test database refuses, in a trigger, any other change made by intake's
// own connections (internal/testenv), so every state-changing statement
// the test suite runs is checked against this table.
var transitions = []Transition{
	// a row's first state
	{"", StateClaimed, []Mover{MoverPoller, MoverReconciler}}, // a claim, or an adopted claim without a row
	{"", StateSpooled, []Mover{MoverOps}},                     // a replay
	// download: the bytes spooled, or the file decided from its name,
	// manifest or hash alone
	{StateClaimed, StateSpooled, []Mover{MoverOwner}},
	{StateClaimed, StateDuplicate, []Mover{MoverOwner}},
	{StateClaimed, StateQuarantined, []Mover{MoverOwner}},
	{StateClaimed, StateFailedTerminal, []Mover{MoverOwner}},
	{StateClaimed, StatePutBack, []Mover{MoverOwner}}, // readiness stable: changed after its claim
	// plan: apply, wait for approval, or decide the file without a row
	{StateSpooled, StateApplying, []Mover{MoverOwner}},
	{StateSpooled, StateAwaitingApproval, []Mover{MoverOwner}},
	{StateSpooled, StateApplied, []Mover{MoverOwner}}, // a group's files, applied in one transaction
	{StateSpooled, StateDuplicate, []Mover{MoverOwner}},
	{StateSpooled, StateArchived, []Mover{MoverOwner}}, // a superseded snapshot
	{StateSpooled, StateQuarantined, []Mover{MoverOwner}},
	{StateSpooled, StateFailedTerminal, []Mover{MoverOwner}},
	// apply
	{StateApplying, StateSpooled, []Mover{MoverOwner}}, // planned again: the mapping changed before a chunk applied
	{StateApplying, StateApplied, []Mover{MoverOwner}},
	{StateApplying, StateOutcomeUnknown, []Mover{MoverOwner}},
	{StateApplying, StateAwaitingApproval, []Mover{MoverOwner}}, // the first chunk found the approved plan changed (Rewait)
	{StateApplying, StateArchived, []Mover{MoverOwner}},         // superseded part way
	{StateApplying, StateQuarantined, []Mover{MoverOwner}},
	{StateApplying, StateFailedTerminal, []Mover{MoverOwner}},
	{StateOutcomeUnknown, StateApplying, []Mover{MoverReconciler}},
	// finish
	{StateApplied, StateArchived, []Mover{MoverOwner}},
	{StateApplied, StateDuplicate, []Mover{MoverOwner}},
	{StateApplied, StateQuarantined, []Mover{MoverOwner}},
	{StateApplied, StateFailedTerminal, []Mover{MoverOwner}},
	// decisions
	{StateAwaitingApproval, StateSpooled, []Mover{MoverOps}}, // approved or rejected
	{StateQuarantined, StateClaimed, []Mover{MoverOps}},      // released before its bytes were spooled
	{StateQuarantined, StateSpooled, []Mover{MoverOps}},      // released
	{StateQuarantined, StateDiscarded, []Mover{MoverOps}},
	{StateFailedTerminal, StateClaimed, []Mover{MoverOps}},
	{StateFailedTerminal, StateSpooled, []Mover{MoverOps}},
	{StateFailedTerminal, StateDiscarded, []Mover{MoverOps}},
}

// Transitions lists every change of state the ledger's statements make.
func Transitions() []Transition { return append([]Transition(nil), transitions...) }

// Allowed reports whether the transition table lets who move a row from -> to.
func Allowed(from, to State, who Mover) bool {
	for _, t := range transitions {
		if t.From == from && t.To == to && slices.Contains(t.By, who) {
			return true
		}
	}
	return false
}
