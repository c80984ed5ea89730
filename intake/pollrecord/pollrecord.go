// Package pollrecord keeps the daemon's poll outcomes for `intake status`
// and writes them to intake_partner_poll once a second, all partners' in
// one statement (ledger.RecordPolls).
package pollrecord

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/internal/pgerr"
)

// Every is how often the daemon writes its partners' poll outcomes
// (intake_partner_poll, what `intake status` shows).
const Every = time.Second

// Recorder keeps each partner's poll outcomes until the daemon writes
// them, all partners' in one statement (ledger.RecordPolls): a fleet of
// 1,000 partners `@every 30s` made 33 committed writes a second of them
// before (docs/performance.md). The outcomes are the partners'
// latest: a partner polled twice between writes is written once, its
// last successful and its last failed poll each kept. What the daemon
// acts on never waits for this: it is what `intake status` reports, at
// most pollRecordEvery late, and a crash loses at most that much of it
// (the next poll records again).
type Recorder struct {
	ledger  *ledger.Ledger
	worker  string
	log     *slog.Logger
	writing sync.Mutex // one write at a time: a write's outcomes are re-queued before the next takes any
	mu      sync.Mutex
	pending map[string]*pollOutcome
	now     func() time.Time // the clock outcomes are stamped with; nil: time.Now (tests set it)
}

// pollOutcome is one partner's outcomes not yet written (zero times:
// none of that kind).
type pollOutcome struct {
	okAt   time.Time
	ready  int
	oldest time.Time
	errAt  time.Time
	err    string
}

// merge keeps the later of each kind of outcome.
func (o *pollOutcome) merge(n pollOutcome) {
	if n.okAt.After(o.okAt) {
		o.okAt, o.ready, o.oldest = n.okAt, n.ready, n.oldest
	}
	if n.errAt.After(o.errAt) {
		o.errAt, o.err = n.errAt, n.err
	}
}

// New is a recorder of worker's polls, written through l.
func New(l *ledger.Ledger, worker string, log *slog.Logger) *Recorder {
	return &Recorder{ledger: l, worker: worker, log: log}
}

// Add notes a poll of partner that ended now.
func (r *Recorder) Add(partner string, pollErr error, ready int, oldest time.Time) {
	at := time.Now()
	if r.now != nil {
		at = r.now()
	}
	n := pollOutcome{}
	if pollErr == nil {
		n.okAt, n.ready, n.oldest = at, ready, oldest
	} else {
		n.errAt, n.err = at, pgerr.Redact(pollErr) // made a storable text by ledger.RecordPolls
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[string]*pollOutcome{}
	}
	if o, ok := r.pending[partner]; ok {
		o.merge(n)
		return
	}
	r.pending[partner] = &n
}

// write writes every pending outcome in one statement. Outcomes a write
// could not store are kept for the next write (merged with those noted
// meanwhile), unless PostgreSQL refused their data: those are dropped, so
// that no outcome blocks the others' for good.
func (r *Recorder) write(ctx context.Context, l *ledger.Ledger, worker string) error {
	r.writing.Lock()
	defer r.writing.Unlock()
	r.mu.Lock()
	taken := r.pending
	r.pending = nil
	r.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}
	recs := make([]ledger.PollRecord, 0, len(taken))
	for id, o := range taken {
		recs = append(recs, ledger.PollRecord{Partner: id, OKAt: o.okAt, Ready: o.ready, Oldest: o.oldest, ErrAt: o.errAt, Err: o.err})
	}
	err := l.RecordPolls(ctx, worker, recs)
	var pe *pgconn.PgError
	if err == nil || (errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23"))) {
		return err
	}
	r.mu.Lock()
	if r.pending == nil {
		r.pending = taken
	} else {
		for id, o := range taken {
			if n, ok := r.pending[id]; ok {
				o.merge(*n)
			}
			r.pending[id] = o
		}
	}
	r.mu.Unlock()
	return err
}

// Run writes the pending poll outcomes every Every until ctx ends (the
// daemon's Stop writes what is left: Flush).
func (r *Recorder) Run(ctx context.Context) { lifecycle.RunEvery(ctx, Every, r.Flush) }

// Flush writes the pending poll outcomes now, on a context of its own: a
// poll cut short by shutdown is still worth recording.
func (r *Recorder) Flush() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.write(ctx, r.ledger, r.worker); err != nil {
		r.log.Warn("record poll outcomes", "err", err)
	}
}
