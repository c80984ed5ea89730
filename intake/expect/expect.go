// Package expect raises expected deliveries that do not come: per feed with an `expect:` block, every window that closes
// without an accepted file is recorded once in PostgreSQL
// (intake_feed_late), counted in intake_feed_late{partner,feed} and
// logged; the first accepted file claimed after a late window's deadline
// closes it and says so. A window ops acknowledged (`intake expect ack`)
// is no longer counted, and a late file still closes it.
//
// The evaluator is a lifecycle.Service of its own beside the reconciler,
// leader-free: every replica evaluates every feed each check_every, one
// transaction per feed that locks the feed's intake_feed_expect row, so
// replicas decide each window once and a restart continues from the row.
// It is not a step of the reconciler because the reconciler's run lists
// every partner's SFTP site and may wait out a hung site for
// partner_timeout: a deadline must be judged on time from the ledger alone,
// whatever the sites do.
//
// Windows (docs/design.md "Expected deliveries"): the scheduled times S of
// the schedule in the feed's timezone, a calendar day's skipped; the
// window of S is (D_prev, D] with D = S + grace and D_prev the deadline of
// the previous window (or when intake first evaluated the feed). An
// accepted file belongs to the latest delivery window scheduled at or
// before its claim time: when that window is open late, the file closes it
// (it arrived late) and counts for nothing else; otherwise it delivers the
// window open when it was claimed. A missed window therefore never makes a
// later on-time file late: it stays late until its own file comes. A window whose deadline passes
// without a delivery is late. A file still in flight when a deadline
// passes defers the decision until it is accepted or refused.
package expect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/lifecycle"
	"github.com/partner-intake/partner-intake/partners"
)

// Defaults and bounds of one evaluation.
const (
	DefaultCheckEvery = 15 * time.Second
	// Settle: a deadline is judged this long after it passed, so a claim
	// whose transaction began just before it is visible.
	Settle = time.Second
	// maxWindows bounds one feed's evaluation; a backlog (a cluster down
	// for long, an @every schedule) is worked off over successive checks.
	maxWindows = 1000
)

// Service evaluates the windows of every feed with an expect block.
type Service struct {
	life   lifecycle.Base
	db     *pgxpool.Pool
	ledger *ledger.Ledger
	worker string
	every  time.Duration
	log    *slog.Logger

	parts *partners.Current

	late     *prometheus.GaugeVec
	raised   *prometheus.CounterVec
	arrived  *prometheus.CounterVec
	errors   prometheus.Counter
	lastOK   prometheus.Gauge
	gaugeSet map[[2]string]bool
}

// New returns a stopped evaluator; every is how often it evaluates
// (DefaultCheckEvery when 0).
func New(db *pgxpool.Pool, worker string, every time.Duration, parts []partners.Config, reg prometheus.Registerer, log *slog.Logger) *Service {
	if every <= 0 {
		every = DefaultCheckEvery
	}
	s := &Service{db: db, ledger: ledger.New(db, 0), worker: worker, every: every, log: log, parts: partners.NewCurrent(parts), gaugeSet: map[[2]string]bool{}}
	s.late = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "intake_feed_late",
		Help: "Delivery windows of the feed that closed without an accepted file and that no late file has closed nor ops acknowledged (intake expect ack) yet (cluster-wide, from the database)."},
		[]string{"partner", "feed"})
	s.raised = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "intake_feed_late_windows_total",
		Help: "Delivery windows this replica recorded as late (each window is recorded by one replica)."}, []string{"partner", "feed"})
	s.arrived = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "intake_feed_late_arrivals_total",
		Help: "Late windows this replica saw closed by a file that arrived after the deadline."}, []string{"partner", "feed"})
	s.errors = prometheus.NewCounter(prometheus.CounterOpts{Name: "intake_expect_errors_total",
		Help: "Evaluations of a feed's delivery windows that failed (retried at the next check)."})
	s.lastOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: "intake_expect_last_success_timestamp_seconds",
		Help: "When this replica last evaluated every expected feed without an error."})
	reg.MustRegister(s.late, s.raised, s.arrived, s.errors, s.lastOK)
	return s
}

// SetPartners makes parts (validated) those of the next checks (a reload).
func (s *Service) SetPartners(parts []partners.Config) { s.parts.Set(parts) }

// Start evaluates at once, then every check interval, until Stop.
func (s *Service) Start(ctx context.Context) error {
	ctx, err := s.life.Begin(ctx)
	if err != nil {
		return fmt.Errorf("expect: %w", err)
	}
	s.life.Go(func() { lifecycle.RunEvery(ctx, s.every, func() { s.RunOnce(ctx, time.Now()) }) })
	return nil
}

// Stop ends the checks and waits for one in progress.
func (s *Service) Stop() { s.life.Stop() }

// RunOnce evaluates every expected feed at now and refreshes the gauge.
func (s *Service) RunOnce(ctx context.Context, now time.Time) error {
	var errs []error
	var ids []string
	want := map[[2]string]bool{}
	for _, p := range s.parts.Get() {
		ids = append(ids, p.ID)
		for i := range p.Feeds {
			f := &p.Feeds[i]
			if f.Expect == nil {
				continue
			}
			want[[2]string{p.ID, f.Name}] = true
			if err := s.evaluate(ctx, p.ID, f.Name, f.Expect, now); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.errors.Inc()
				s.log.Error("expected deliveries: evaluation failed", "partner", p.ID, "feed", f.Name, "err", err)
				errs = append(errs, err)
			}
		}
	}
	if len(want) == 0 {
		s.lastOK.SetToCurrentTime() // nothing to evaluate is a success
		return nil
	}
	counts, err := s.ledger.OpenLateCounts(ctx, ids)
	if err != nil {
		s.errors.Inc()
		return errors.Join(append(errs, err)...)
	}
	open := map[[2]string]int64{}
	for _, c := range counts {
		open[[2]string{c.Partner, c.Feed}] = c.Open
	}
	for k := range s.gaugeSet {
		if !want[k] {
			s.late.DeleteLabelValues(k[0], k[1])
			delete(s.gaugeSet, k)
		}
	}
	for k := range want {
		s.late.WithLabelValues(k[0], k[1]).Set(float64(open[k]))
		s.gaugeSet[k] = true
	}
	if len(errs) == 0 {
		s.lastOK.SetToCurrentTime()
	}
	return errors.Join(errs...)
}

// evaluate decides the feed's windows whose deadline passed by now, and
// closes the late ones a file has arrived for since. A window is
// delivered by an accepted file claimed after the previous window's
// deadline and by its own, other than one that closed a late window; a
// late window is closed by the first accepted file claimed after its
// deadline and before the next delivery is scheduled. Nothing at or after
// a file still in flight claimed since the last decided deadline is
// decided yet, and a deadline is judged Settle after it. What it reads is
// bounded by windows, not files (ledger.Deliveries): a busy feed, or a
// late window left open for long, never stalls it.
func (s *Service) evaluate(ctx context.Context, partner, feed string, exp *partners.Expect, now time.Time) error {
	now = now.Truncate(time.Second)
	return s.ledger.EvaluateExpect(ctx, partner, feed, now, func(tx *ledger.ExpectTx, st ledger.ExpectState) error {
		open, err := tx.OpenLate(ctx)
		if err != nil {
			return err
		}
		cut := now.Add(-Settle)
		pending, err := tx.FirstPending(ctx, st.LastDeadline)
		if err != nil {
			return err
		}
		if !pending.IsZero() {
			cut = minTime(cut, pending)
		}
		// the windows due: scheduled, and their deadline passed before cut
		var due []ledger.LateWindow
		lastS := st.LastScheduled
		for n := 0; n < maxWindows; n++ {
			sched := exp.Next(lastS)
			if sched.IsZero() || sched.After(cut) {
				break
			}
			if exp.NoDelivery(sched) {
				lastS = sched
				continue
			}
			deadline := exp.Deadline(sched)
			if deadline.After(cut) {
				break
			}
			due = append(due, ledger.LateWindow{Partner: partner, Feed: feed, Scheduled: sched, Deadline: deadline})
			lastS = sched
		}
		// closes: the span in which a file closes window w, late
		closes := func(w ledger.LateWindow) ledger.DeliverySpan {
			before := nextDelivery(exp, w.Scheduled)
			if before.IsZero() || before.After(cut) {
				before = cut
			}
			return ledger.DeliverySpan{After: w.Deadline, Before: before}
		}
		// one read: each open window's closing span, then each due
		// window's own (previous deadline, deadline] and closing span
		spans := make([]ledger.DeliverySpan, 0, len(open)+2*len(due))
		for _, w := range open {
			spans = append(spans, closes(w))
		}
		prev := st.LastDeadline
		for _, w := range due {
			spans = append(spans, ledger.DeliverySpan{After: prev, Before: w.Deadline.Add(time.Microsecond)}, closes(w))
			prev = w.Deadline
		}
		got, err := tx.Deliveries(ctx, spans)
		if err != nil {
			return err
		}
		// the files that closed a window in this evaluation, by claim
		var closers []time.Time
		closeLate := func(w ledger.LateWindow, d ledger.SpanDeliveries) error {
			f := d.First
			if f.IntakeID == 0 {
				return nil
			}
			if err := tx.CloseLate(ctx, w.Scheduled, f.IntakeID, f.ClaimedAt); err != nil {
				return err
			}
			closers = append(closers, f.ClaimedAt)
			s.arrived.WithLabelValues(partner, feed).Inc()
			s.log.Warn("late delivery arrived", "partner", partner, "feed", feed, "intake_id", f.IntakeID,
				"scheduled", w.Scheduled.In(exp.Location()).Format(time.RFC3339), "deadline", w.Deadline.In(exp.Location()).Format(time.RFC3339),
				"late_by", f.ClaimedAt.Sub(w.Deadline).Round(time.Second).String())
			return nil
		}
		for i, w := range open {
			if err := closeLate(w, got[i]); err != nil {
				return err
			}
		}
		lastD := st.LastDeadline
		for k, w := range due {
			own, late := got[len(open)+2*k], got[len(open)+2*k+1]
			n := own.Count // up to two; a file that closed a late window delivers no other
			for _, at := range closers {
				if at.After(lastD) && !at.After(w.Deadline) {
					n--
				}
			}
			if n <= 0 {
				won, err := tx.RaiseLate(ctx, w.Scheduled, w.Deadline, s.worker)
				if err != nil {
					return err
				}
				if won { // else recorded before: not this evaluation's to close
					s.raised.WithLabelValues(partner, feed).Inc()
					s.log.Warn("expected delivery late: the window closed without an accepted file", "partner", partner, "feed", feed,
						"scheduled", w.Scheduled.In(exp.Location()).Format(time.RFC3339), "deadline", w.Deadline.In(exp.Location()).Format(time.RFC3339))
					if err := closeLate(w, late); err != nil {
						return err
					}
				}
			}
			lastD = w.Deadline
		}
		if lastS.Equal(st.LastScheduled) && lastD.Equal(st.LastDeadline) {
			return nil
		}
		return tx.Advance(ctx, lastS, lastD)
	})
}

// nextDelivery is the first scheduled time after s that is not a calendar
// day (zero: none within maxWindows).
func nextDelivery(exp *partners.Expect, s time.Time) time.Time {
	for n := 0; n < maxWindows; n++ {
		s = exp.Next(s)
		if s.IsZero() || !exp.NoDelivery(s) {
			return s
		}
	}
	return time.Time{}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Window is one scheduled delivery, for `intake expect`.
type Window struct {
	Scheduled, Deadline time.Time
	// NoDelivery: the day is in the calendar; nothing is expected.
	NoDelivery bool
}

// Upcoming lists the next n scheduled times after now (calendar days
// included and marked).
func Upcoming(exp *partners.Expect, now time.Time, n int) []Window {
	var out []Window
	t := now
	for len(out) < n {
		s := exp.Next(t)
		if s.IsZero() {
			break
		}
		out = append(out, Window{Scheduled: s, Deadline: exp.Deadline(s), NoDelivery: exp.NoDelivery(s)})
		t = s
	}
	return out
}
