package ops

import (
	"errors"
	"testing"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// What releasing a held file does, by why it was held: the override it
// carries, the state it resumes in, the audit's action, or the refusal.
// A spec table: planRelease is the one place a release is decided, for
// the CLI and the console alike.
func TestWhatAReleaseDoesByWhyTheFileWasHeld(t *testing.T) {
	held := func(reason reason.Code, sha string) *ledger.Held {
		return &ledger.Held{Partner: "acme", Reason: reason, QState: "open", FState: "quarantined", Feed: "orders",
			BatchID: "b1", SHA256: sha, Path: "/quarantine/7.orders-1.csv", Hold: "h1"}
	}
	const sha = "ab"
	for _, tc := range []struct {
		name     string
		h        *ledger.Held
		winner   string
		hold     string // the hold the decision names
		refused  bool
		action   string
		override string
		next     ledger.State
		discard  bool
		rebind   bool
	}{
		{name: "not held", h: nil, refused: true},
		{name: "held again since the actor looked", h: held(reason.RejectRate, sha), hold: "h0", refused: true},
		{name: "the hold the actor saw", h: held(reason.RejectRate, sha), hold: "h1",
			action: "release", override: ledger.OverrideRejectRate, next: ledger.StateSpooled},
		{name: "decided already", h: func() *ledger.Held { h := held(reason.RejectRate, sha); h.QState = "released"; return h }(), refused: true},
		{name: "a hostile entry", h: func() *ledger.Held { h := held(reason.RejectRate, ""); h.Feed = ledger.NoFeed; return h }(), refused: true},
		{name: "not a regular file", h: held(reason.NotRegularFile, ""), refused: true},
		{name: "no usable batch id", h: held(reason.BadBatchID, sha), refused: true},
		{name: "changed after its claim: its spool holds part of it", h: held(reason.ChangedAfterClaim, sha), refused: true},
		{name: "a batch conflict without a winner", h: held(reason.BatchConflict, sha), refused: true},
		{name: "a batch conflict, the old bytes win", h: held(reason.BatchConflict, sha), winner: WinnerOld,
			action: "release_conflict_old_wins", discard: true},
		{name: "a batch conflict, the new bytes win", h: held(reason.BatchConflict, sha), winner: WinnerNew,
			action: "release", override: ledger.OverrideConflictNewWin, next: ledger.StateSpooled, rebind: true},
		{name: "too many rejected rows", h: held(reason.RejectRate, sha),
			action: "release", override: ledger.OverrideRejectRate, next: ledger.StateSpooled},
		{name: "the manifest disagrees", h: held(reason.ManifestMismatch, sha),
			action: "release", override: ledger.OverrideManifest, next: ledger.StateSpooled},
		{name: "too large, never spooled", h: held(reason.FileTooLarge, ""),
			action: "release", override: ledger.OverrideSize, next: ledger.StateClaimed},
		{name: "another reason: nothing to override", h: held(reason.RetriesExhausted, sha),
			action: "release", override: ledger.OverrideNothing, next: ledger.StateSpooled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := planRelease(Decision{IntakeID: 7, Winner: tc.winner, Hold: tc.hold}, tc.h)
			if tc.refused {
				if !errors.Is(err, ledger.ErrDecision) {
					t.Fatalf("got %+v, %v; want it refused as a decision", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.action != tc.action || r.override != tc.override || r.next != tc.next || r.discard != tc.discard || r.rebind != tc.rebind {
				t.Fatalf("got %+v, want action %s override %q next %s discard %t rebind %t", r, tc.action, tc.override, tc.next, tc.discard, tc.rebind)
			}
			if !tc.discard && r.detail == "" {
				t.Fatal("no detail for the audit")
			}
		})
	}
}

// Every reason a held file can only be discarded for says why when a
// release is refused; a reason missing here would be refused with no
// explanation.
func TestEveryDiscardOnlyReasonSaysWhy(t *testing.T) {
	for _, c := range ledger.DiscardOnly {
		if discardOnlyWhy[reason.Code(c)] == "" {
			t.Errorf("%s: a release is refused without saying why", c)
		}
	}
	if len(discardOnlyWhy) != len(ledger.DiscardOnly) {
		t.Errorf("%d explanations for %d discard-only reasons", len(discardOnlyWhy), len(ledger.DiscardOnly))
	}
}
