package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// An ops command that changes a row (release, discard, approve, reject,
// replay) says which row before it can fail, under a request id recorded
// on the action's audit row; when it fails, it says what became of the
// row, so that running it again is never a second action:
//
//   - refused: the decision was refused; nothing changed;
//   - rolled back: the action's transaction did not commit; nothing
//     changed, and running it again is safe;
//   - recorded: the commit's reply was lost but the action is recorded
//     (its audit row carries the request id): it stands, as if the
//     command had succeeded;
//   - unknown: the database did not answer within settleWait; the request
//     id finds the action later (intake audit --request).
//
// Each outcome has its exit code, so that a script tells them apart
// without reading the text: 0 done (or recorded), exitRefused, 1 rolled
// back (safe to run again), exitUnknown.

// Exit codes beside 0 (ok), 1 (needs attention; an action: failed,
// nothing changed) and 2 (usage or config error).
const (
	// exitRefused: the action was refused, nothing changed; running it
	// again is refused too until what it met changes.
	exitRefused = 3
	// exitUnknown: whether the action took effect is not known yet:
	// the database did not answer, or a replay's file ended in
	// outcome_unknown, which a reconciler settles.
	exitUnknown = 4
)

// settleWait bounds how long a failed command waits for the database to
// answer before it says the outcome is unknown.
const settleWait = time.Minute

// newRequestID is a fresh request id: "req-" and 16 hex digits.
func newRequestID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return "req-" + hex.EncodeToString(b[:])
}

// act runs an ops command's action, one transaction recording its
// request id in the audit. Its error is the action's, or a fault's that
// loses the reply to its commit: either way the command then reads by
// request whether the action was recorded (decisionFailed, actionFailed).
func act(action func() error) error {
	err := action()
	if err == nil {
		err = fault.Check("ops:reply_lost") // the reply to the commit lost
	}
	return err
}

// decisionFailed reports a decision (release, discard, approve, reject)
// on intake id that failed with err, and returns the command's exit code:
// 0 when it was recorded all the same (its reply lost), and the command
// then goes on as if it had succeeded. again says why running it again
// cannot act twice when the outcome is unknown.
func decisionFailed(ctx context.Context, pool *pgxpool.Pool, stderr io.Writer, cmd string, id int64, request, again string, err error) int {
	return actionFailed(ctx, pool, stderr, cmd, fmt.Sprintf("intake %d", id), request, again, err)
}

// actionFailed is decisionFailed for an action on subject ("intake 29",
// "window acme/orders 2026-12-01T06:00:00Z").
func actionFailed(ctx context.Context, pool *pgxpool.Pool, stderr io.Writer, cmd, subject, request, again string, err error) int {
	var ack *ledger.LateAckRefused
	if errors.Is(err, ledger.ErrDecision) || errors.Is(err, ledger.ErrPlanDecision) || errors.As(err, &ack) {
		fmt.Fprintf(stderr, "intake %s: %s: refused, nothing changed: %s\n", cmd, subject, inert.Lines(err.Error()))
		return exitRefused
	}
	settled, serr := ops.Settle(ctx, pool, request, settleWait)
	switch settled {
	case ledger.SettledRecorded:
		fmt.Fprintf(stderr, "intake %s: %s: the reply was lost (%s), but the decision is recorded (request %s)\n", cmd, subject, inert.Lines(pgerr.Redact(err)), request)
		return 0
	case ledger.SettledRolledBack:
		fmt.Fprintf(stderr, "intake %s: %s: failed, rolled back: nothing changed; running the command again is safe (%s)\n", cmd, subject, inert.Lines(pgerr.Redact(err)))
		return 1
	}
	fmt.Fprintf(stderr, "intake %s: %s: whether the decision was recorded is unknown: PostgreSQL did not answer within %s (%s).\n"+
		"Once it does, intake audit --request %s shows the decision if it was recorded; %s\n",
		cmd, subject, settleWait, inert.Lines(pgerr.Redact(errors.Join(err, serr))), request, again)
	return exitUnknown
}

// replayFailed reports a failed replay of intake id and what became of
// its row, and returns the command's exit code.
func replayFailed(stderr io.Writer, id int64, request, schedule string, err error) int {
	var left *intake.ReplayLeftError
	var rolled *intake.ReplayNotRecordedError
	var unknown *intake.ReplayUnknownError
	switch {
	case errors.As(err, &left):
		row := left.Row
		fmt.Fprintf(stderr, "intake replay: intake %d (the replay of intake %d) failed in this command: %s\n", row.ID, id, inert.Lines(pgerr.Redact(left.Err)))
		switch {
		case row.State == "":
			fmt.Fprintf(stderr, "where intake %d stands is unknown: PostgreSQL did not answer; a reconciler takes it over when its lease ends and finishes it.\n", row.ID)
		case left.HandedOver:
			fmt.Fprintf(stderr, "intake %d is %s: handed over: the next reconcile run (%s) takes it over and finishes it.\n", row.ID, row.State, schedule)
		default:
			fmt.Fprintf(stderr, "intake %d is %s (worker %s): %s.\n", row.ID, row.State, row.Worker, row.State.Info().Fate)
		}
		fmt.Fprintf(stderr, "Do not replay intake %d again: intake %d is that replay (intake status shows it).\n", id, row.ID)
		return replayExit(row.State)
	case errors.As(err, &rolled):
		fmt.Fprintf(stderr, "intake replay: intake %d: failed, rolled back: no replay was recorded, nothing changed; running the replay again is safe (%s)\n", id, inert.Lines(pgerr.Redact(rolled.Err)))
		return 1
	case errors.As(err, &unknown):
		fmt.Fprintf(stderr, "intake replay: intake %d: whether replay request %s was recorded is unknown: PostgreSQL did not answer within a minute (%s).\n"+
			"Once it does, intake audit --request %s names the replay if it was recorded; a second replay is refused while that one is live.\n",
			id, request, inert.Lines(pgerr.Redact(unknown.Err)), request)
		return exitUnknown
	case errors.Is(err, ledger.ErrDecision):
		fmt.Fprintf(stderr, "intake replay: intake %d: refused, nothing changed: %s\n", id, inert.Lines(err.Error()))
		return exitRefused
	}
	// failed before its row was inserted (the checks): nothing changed
	fmt.Fprintf(stderr, "intake replay: intake %d: failed before a replay was recorded: nothing changed; running the replay again is safe (%s)\n", id, inert.Lines(pgerr.Redact(err)))
	return 1
}

// replayExit is the exit code of a replay whose row is in state s: 0 when
// it is finished (or waits for an approval, as its feed asks), 1 when it
// was held or failed for good (a human decides), exitUnknown while where
// it ends is not known yet (outcome_unknown, which a reconciler settles;
// a row still live, applied but not archived, handed over; "": the
// database did not say).
func replayExit(s ledger.State) int {
	switch s {
	case ledger.StateArchived, ledger.StateDuplicate, ledger.StateAwaitingApproval:
		return 0
	case ledger.StateQuarantined, ledger.StateFailedTerminal, ledger.StateDiscarded, ledger.StatePutBack:
		return 1
	}
	return exitUnknown
}
