package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// ReplayRequest is one ops request to replay a finished file.
type ReplayRequest struct {
	// ID is the intake replayed.
	ID            int64
	Actor, Reason string
	// Request is the command's request id, recorded on the replay's audit
	// row (ledger.Requested finds the replay by it after a lost reply).
	Request string
	// ForceOlder replays a snapshot older than one its feed has applied
	// since, audited as such.
	ForceOlder bool
	// Handover records the replay and leaves it to a daemon: its row is
	// committed with its lease ended, the next reconcile run takes it
	// over and the taker's daemon applies it from its spool. What the ops
	// role runs: it may record a replay (grants.sql), not apply one, and
	// the spool is the daemon's.
	Handover bool
	// Inserted, if set, is called with the replay's row as soon as it is
	// committed, before anything of it can fail.
	Inserted func(*ledger.Intake)
	// Progress, if set, is called after each committed chunk.
	Progress func(done, total int64)
}

// Replay applies the spooled bytes of a finished file again (after a
// mapping or target fix, say) as a new intake of the same batch, audited.
// It is idempotent by construction: rows whose values do not change are
// counted unchanged, and the replay writes as the intake that brought the
// bytes it applies (the file replayed; for a duplicate, the earlier intake
// of its batch and bytes; for a replay, what that replay wrote as), so rows
// a later intake wrote are held back as conflicts, never overwritten. The
// replay's receipt goes to the partner's reports/; its bytes stay archived
// under the original. A snapshot older than one its feed has applied since
// is refused (snapshot.go): replayed, it would take the table back to an
// older set; ForceOlder replays it all the same, audited as such. A second
// replay of the same bytes while one is live is refused, naming it.
//
// Once the replay's row is committed (Inserted), a failure leaves it to
// a reconciler: the row is handed over (its lease ended under the
// command's token) when the database still answers, and the error returned
// is a *ReplayLeftError saying where the row stands.
func (d *Daemon) Replay(ctx context.Context, q ReplayRequest) (*ledger.Intake, error) {
	id := q.ID
	if q.Actor == "" || q.Reason == "" {
		return nil, fmt.Errorf("%w: an actor and a reason are required", ledger.ErrDecision)
	}
	var orig *ledger.Intake
	for _, pid := range d.parts.order {
		got, err := d.ledger.Get(ctx, pid, id)
		if err != nil {
			return nil, err
		}
		if got != nil {
			orig = got
		}
	}
	if orig == nil {
		return nil, fmt.Errorf("%w: no intake %d of a configured partner", ledger.ErrDecision, id)
	}
	if orig.State != ledger.StateArchived && orig.State != ledger.StateDuplicate {
		return nil, fmt.Errorf("%w: intake %d is %s; only finished files are replayed", ledger.ErrDecision, id, orig.State)
	}
	// a compressed file's expanded copy is made again from the original
	// (dropExpanded removed it when the file finished)
	// kept (spool.Keep): a purge deciding meanwhile looks again before it
	// removes them
	if !q.Handover && !d.spool.Keep(orig.Partner, orig.DataSHA256, orig.DataSize) && !d.spool.Keep(orig.Partner, orig.SHA256, orig.Size) {
		return nil, fmt.Errorf("%w: the spool no longer holds the bytes of intake %d", ledger.ErrDecision, id)
	}
	p := d.parts.byID[orig.Partner]
	// root is the intake the replay writes as, the one that brought the
	// bytes it applies: rows any later intake wrote are then conflicts of
	// the replay (merge's newer-than guard), never set back
	root := orig.ID
	switch {
	case orig.ReplayOf != 0: // a replay of a replay is judged as the first
		root = orig.ReplayOf
	case orig.State == ledger.StateDuplicate: // its bytes came with an earlier intake
		brought, err := d.ledger.BroughtBy(ctx, orig)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		if brought == 0 {
			return nil, fmt.Errorf("%w: no intake before duplicate %d brought its bytes of batch %s", ledger.ErrDecision, id, orig.BatchID)
		}
		root = brought
	}
	override := ""
	if feed := p.cfg.Feed(orig.Feed); feed != nil && feed.Mode == partners.ModeSnapshot {
		newer, err := ledger.SupersededBy(ctx, d.db, orig.Partner, orig.Feed, root, false)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		switch {
		case newer != 0 && !q.ForceOlder:
			return nil, fmt.Errorf("%w: intake %d is a snapshot older than intake %d, which its feed has applied since: replayed, it would undo the newer one (--force-older replays it all the same, audited)", ledger.ErrDecision, id, newer)
		case newer != 0:
			override = OverrideOlder
		}
	}
	in, err := d.ledger.InsertReplay(ctx, orig, fmt.Sprintf("replay:%d:%d", id, time.Now().UnixNano()),
		OpsWorker(d.cfg.WorkerID), root, override, q.Request, q.Actor, q.Reason, q.Handover)
	var live *ledger.LiveReplayError
	if errors.As(err, &live) {
		return nil, fmt.Errorf("%w: %w", ledger.ErrDecision, err)
	}
	if err == nil {
		err = fault.Check("replay:inserted") // the commit's reply lost
	}
	if err != nil {
		return settleReplay(ctx, d.ledger, q, orig.Partner, err)
	}
	if q.Inserted != nil {
		q.Inserted(in)
	}
	if q.Handover {
		return in, nil
	}
	// the replay's row is run to its end on a session of its own
	run := func() error {
		sess, err := sftpconn.Dial(ctx, p.cfg)
		if err != nil {
			return err
		}
		defer sess.Close()
		r, err := d.newRun(p, sess, in)
		if err != nil {
			return err
		}
		r.progress = q.Progress
		return r.run(ctx)
	}
	if err := run(); err != nil {
		return in, leaveReplay(ctx, d.ledger, in, err)
	}
	return in, nil
}

// settleReplay finds out what became of a replay whose insert failed:
// recorded (its reply lost: the row is then left as a failed run's is),
// rolled back, or unknown.
func settleReplay(ctx context.Context, l *ledger.Ledger, q ReplayRequest, partner string, insertErr error) (*ledger.Intake, error) {
	if q.Request == "" {
		return nil, fmt.Errorf("replay: %w", insertErr)
	}
	settled, id, err := l.Settle(ctx, q.Request, replaySettleWait)
	switch settled {
	case ledger.SettledRolledBack:
		return nil, &ReplayNotRecordedError{Err: insertErr}
	case ledger.SettledUnknown:
		return nil, &ReplayUnknownError{Request: q.Request, Err: errors.Join(insertErr, err)}
	}
	in, err := ledger.AwaitAnswer(ctx, func(ctx context.Context) (*ledger.Intake, error) { return l.Get(ctx, partner, id) })
	if err != nil || in == nil {
		return nil, &ReplayUnknownError{Request: q.Request, Err: errors.Join(insertErr, err)}
	}
	if q.Inserted != nil {
		q.Inserted(in)
	}
	if q.Handover {
		return in, nil // recorded, handed over at birth: what was asked
	}
	return in, leaveReplay(ctx, l, in, fmt.Errorf("the reply to its commit was lost: %w", insertErr))
}

// ReplayNotRecordedError: a replay's insert failed and its transaction was
// rolled back: nothing of it exists, and replaying again is safe.
type ReplayNotRecordedError struct{ Err error }

func (e *ReplayNotRecordedError) Error() string {
	return fmt.Sprintf("no replay was recorded (rolled back): %v", e.Err)
}
func (e *ReplayNotRecordedError) Unwrap() error { return e.Err }

// ReplayUnknownError: a replay's insert failed and the database did not
// say, within the wait, whether it was recorded; Request finds it later.
type ReplayUnknownError struct {
	Request string
	Err     error
}

func (e *ReplayUnknownError) Error() string {
	return fmt.Sprintf("whether replay request %s was recorded is unknown: %v", e.Request, e.Err)
}
func (e *ReplayUnknownError) Unwrap() error { return e.Err }

// ReplayLeftError: a replay's row was committed and its run failed; the
// row is left to a reconciler (or ops, as its state says).
type ReplayLeftError struct {
	// Row is the replay's row as last read (State "" when the database
	// did not answer).
	Row *ledger.Intake
	// HandedOver: the command ended its lease, so the next reconcile run
	// takes it over.
	HandedOver bool
	Err        error
}

func (e *ReplayLeftError) Error() string { return fmt.Sprintf("replay intake %d: %v", e.Row.ID, e.Err) }
func (e *ReplayLeftError) Unwrap() error { return e.Err }

// leaveReplay reads a failed replay's row again and, while the command
// still holds it live, hands it over to the next reconcile run.
func leaveReplay(ctx context.Context, l *ledger.Ledger, in *ledger.Intake, runErr error) error {
	left := &ReplayLeftError{Row: &ledger.Intake{ID: in.ID, Partner: in.Partner}, Err: runErr}
	// The database may be coming back from a crash: a fresh context
	// bounded on its own, so a cancelled command still says where its
	// row stands when it can.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replaySettleWait)
	defer cancel()
	now, err := ledger.AwaitAnswer(actx, func(ctx context.Context) (*ledger.Intake, error) { return l.Get(ctx, in.Partner, in.ID) })
	if err != nil || now == nil {
		return left
	}
	left.Row = now
	if now.State.Info().Live && now.Worker == in.Worker && now.Token == in.Token {
		left.HandedOver, _ = l.Handover(actx, now)
	}
	return left
}

// replaySettleWait bounds how long a failed replay waits for the database
// to answer before it says it cannot tell where its row stands.
const replaySettleWait = time.Minute
