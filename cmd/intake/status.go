package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/migrations"
)

// statusProcessingStale: past it `intake status` says a partner's oldest
// unfinished file needs attention (its polls: ops.PollStale).
const statusProcessingStale = time.Hour

// statusCommand is `intake status`.
func statusCommand() *cobra.Command {
	var only string
	cmd := &cobra.Command{
		Use:     "status --config FILE [--partner P]",
		Short:   "files by state, oldest claims, open quarantine, last poll and findings; exit 1 when something needs attention",
		Example: "intake status --config /etc/intake/intake.yaml --partner acme",
	}
	cmd.Flags().StringVar(&only, "partner", "", "show only this partner")
	return withConfig(cmd, "", func(path string, stdout, stderr io.Writer) int { return cmdStatus(path, only, stdout, stderr) })
}

// cmdStatus prints, per partner, files by state, the oldest ready and
// processing ages, open quarantine, the last successful poll and the last
// reconciler findings. It exits 1 when something needs attention. Text a
// partner or its site chose (the names in findings, a poll's error) is
// printed in its printable form (internal/inert).
func cmdStatus(path, only string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	url, err := cfg.DatabaseURL()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var ids []string
	for _, p := range cfg.Partners {
		if only == "" || p.ID == only {
			ids = append(ids, p.ID)
		}
	}
	polls := pollSpecs(cfg.Partners)
	if len(ids) == 0 {
		fmt.Fprintf(stderr, "intake status: no partner %q in %s\n", only, path)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintln(stderr, "intake status: database url:", err)
		return 2
	}
	migrations.SetSearchPath(pc.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		fmt.Fprintln(stderr, "intake status: database:", err)
		return 1
	}
	defer pool.Close()
	rows, err := ops.Status(ctx, pool, ids)
	if err != nil {
		fmt.Fprintln(stderr, "intake status:", err)
		return 1
	}
	attention := 0
	for _, r := range rows {
		attention += printStatus(stdout, r, polls[r.Partner], cfg.Affinity == intake.AffinityNone, time.Now())
	}
	if attention > 0 {
		fmt.Fprintf(stdout, "\n%d thing(s) need attention\n", attention)
		return 1
	}
	fmt.Fprintln(stdout, "\nall well")
	return 0
}

// printStatus prints a partner's status, r, polled on spec (by every live
// replica when everyone: affinity none), and returns how many of its
// lines need attention.
func printStatus(w io.Writer, r ops.StatusRow, spec string, everyone bool, now time.Time) int {
	attention := 0
	mark := func(cond bool) string {
		if cond {
			attention++
			return "ATTN "
		}
		return "     "
	}
	ago := func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return now.Sub(*t).Round(time.Second).String() + " ago"
	}
	fmt.Fprintf(w, "partner %s\n", r.Partner)
	var states []string
	for _, st := range []string{"claimed", "spooled", "applying", "applied", "outcome_unknown", "awaiting_approval", "quarantined", "failed_terminal", "duplicate", "archived"} {
		states = append(states, fmt.Sprintf("%s %d", st, r.ByState[st]))
	}
	fmt.Fprintf(w, "  %sfiles: %s\n", mark(r.ByState["outcome_unknown"] > 0), strings.Join(states, ", "))
	for _, f := range r.Inflight {
		pct := 100.0
		if f.Rows > 0 {
			pct = 100 * float64(f.RowsDone) / float64(f.Rows)
		}
		fmt.Fprintf(w, "       applying intake %d (worker %s): %d of %d rows, %d of %d bytes committed (%.0f%%), %d chunks\n",
			f.IntakeID, f.Worker, f.RowsDone, f.Rows, f.BytesDone, f.Bytes, pct, f.ChunksDone)
	}
	fmt.Fprintf(w, "  %sprocessing: oldest unfinished file claimed %s ago\n", mark(r.OldestProcessing > statusProcessingStale), r.OldestProcessing.Round(time.Second))
	fmt.Fprintf(w, "       ready: %d claimable at the last poll, oldest from %s\n", r.ReadyFiles, ago(r.OldestReady))
	fmt.Fprintf(w, "  %squarantine: %d open, oldest waiting %s\n", mark(r.QuarantineOpen > 0), r.QuarantineOpen, r.QuarantineOldest.Round(time.Second))
	fmt.Fprintf(w, "  %sawaiting approval: %d file(s)\n", mark(len(r.Awaiting) > 0), len(r.Awaiting))
	for _, a := range r.Awaiting {
		fmt.Fprintf(w, "       intake %d (feed %s, %s) planned %s ago, plan %s: intake plan show %d\n",
			a.IntakeID, a.Feed, a.Reason, now.Sub(a.PlannedAt).Round(time.Second), a.PlanHash, a.IntakeID)
	}
	fmt.Fprintf(w, "  %sorphan claims: %d file(s) in processing/ with no row at the last reconciler run\n", mark(r.OrphanClaims > 0), r.OrphanClaims)
	switch {
	case len(r.Replicas) == 0:
		fmt.Fprintln(w, "       replicas: none running")
	case everyone:
		fmt.Fprintf(w, "       replicas: %s (with affinity: none, every one polls it)\n", strings.Join(r.Replicas, ", "))
	default:
		fmt.Fprintf(w, "       replicas: %s (with affinity: partner, %s polls it)\n", strings.Join(r.Replicas, ", "), r.Poller)
	}
	for _, l := range r.Late {
		if l.ClosedBy == 0 && l.AckedAt != nil {
			fmt.Fprintf(w, "       late delivery acknowledged: feed %s, window scheduled %s, by %s %s ago: %s\n",
				l.Feed, l.Scheduled.UTC().Format(time.RFC3339), inert.Text(l.AckedBy), now.Sub(*l.AckedAt).Round(time.Second), inert.Text(l.AckReason))
			continue
		}
		if l.ClosedBy == 0 {
			fmt.Fprintf(w, "  %slate delivery: feed %s, window scheduled %s closed at %s (%s ago) without an accepted file\n",
				mark(true), l.Feed, l.Scheduled.UTC().Format(time.RFC3339), l.Deadline.UTC().Format(time.RFC3339), now.Sub(l.Deadline).Round(time.Second))
			fmt.Fprintf(w, "       no file will come for it: intake expect ack %s/%s %s --reason …\n", r.Partner, l.Feed, l.Scheduled.UTC().Format(time.RFC3339))
			continue
		}
		fmt.Fprintf(w, "       late delivery arrived: feed %s, window scheduled %s, intake %d claimed %s after the deadline\n",
			l.Feed, l.Scheduled.UTC().Format(time.RFC3339), l.ClosedBy, l.ArrivedAt.Sub(l.Deadline).Round(time.Second))
	}
	if r.LateMore > 0 {
		fmt.Fprintf(w, "       and %d older late delivery window(s) not shown (the newest %d are)\n", r.LateMore, len(r.Late))
	}
	if r.Site == nil {
		fmt.Fprintln(w, "       server profile: not measured yet (the daemon measures it at its first poll; intake check prints it)")
	} else {
		fmt.Fprintf(w, "       server profile (measured %s): %s\n", ago(&r.Site.MeasuredAt), r.Site.Profile)
		if r.Site.LimitsMeasuredAt.IsZero() {
			fmt.Fprintln(w, "       server limits: not measured on this site (intake check measures them)")
		} else {
			fmt.Fprintf(w, "       server limits measured by intake check %s\n", ago(&r.Site.LimitsMeasuredAt))
		}
	}
	stale := ops.PollStale(spec, r.LastOK, now)
	fmt.Fprintf(w, "  %slast successful poll: %s\n", mark(stale), ago(r.LastOK))
	if r.LastError != nil && (r.LastOK == nil || r.LastError.After(*r.LastOK)) {
		fmt.Fprintf(w, "       last poll error (%s): %s\n", ago(r.LastError), inert.Text(r.LastErrorText))
	}
	if r.FindingsAt == nil {
		fmt.Fprintln(w, "       reconciler: has not run yet")
	} else {
		fmt.Fprintf(w, "       reconciler (%s): %d finding(s)\n", ago(r.FindingsAt), len(r.Findings))
		for _, f := range r.Findings {
			fmt.Fprintf(w, "  %s  %s intake=%d %s: %s %s\n", mark(f.NeedsHuman), f.Kind, f.IntakeID, inert.Text(f.Path), inert.Text(f.Action), inert.Text(f.Detail))
		}
	}
	return attention
}
