package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake/expect"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/inert"
	"github.com/partner-intake/partner-intake/partners"
)

// expectCommand is `intake expect`.
func expectCommand() *cobra.Command {
	var f expectFlags
	cmd := &cobra.Command{
		Use:         "expect --config FILE [--partner P] [--count N] [--from TIME] | ack PARTNER/FEED WINDOW --config FILE --reason TEXT [--actor NAME]",
		Short:       "list the next delivery windows of every feed with an expect: block, calendar days marked; ack a late window no file will close (audited)",
		Example:     "intake expect --config /etc/intake/intake.yaml --partner acme --count 10",
		Annotations: map[string]string{annSubs: "ack"},
	}
	fs := cmd.Flags()
	configFlag(cmd, &f.path, "config file (YAML)")
	fs.StringVar(&f.only, "partner", "", "show only this partner")
	fs.IntVar(&f.count, "count", 5, "scheduled times to list per feed (1-100)")
	fs.StringVar(&f.from, "from", "", "list the scheduled times after this RFC 3339 time (default: now)")
	fs.StringVar(&f.reason, "reason", "", "ack: why no file is due for the window (audited)")
	fs.StringVar(&f.actor, "actor", defaultActor(), "ack: who acknowledges (audited)")
	requiredBy(cmd, "reason", "ack")
	return runs(cmd, func(args []string, stdout, stderr io.Writer) int { return cmdExpect(f, args, stdout, stderr) })
}

// expectFlags are intake expect's flags.
type expectFlags struct {
	path, only, from, reason, actor string
	count                           int
}

// cmdExpect lists the next delivery windows of every feed with an expect:
// block, calendar days marked, so ops can check a schedule and a calendar
// before they are in force. It reads the config only (no database).
func cmdExpect(f expectFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "ack" {
		return cmdExpectAck(f, args[1:], stdout, stderr)
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "intake expect: takes no arguments but ack (got %q)\n", inert.Text(args[0]))
		return 2
	}
	if f.count < 1 || f.count > 100 {
		fmt.Fprintln(stderr, "intake expect: --count must be between 1 and 100")
		return 2
	}
	cfg, err := config.Load(f.path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	now, found, feeds := time.Now(), false, 0
	if f.from != "" {
		if now, err = time.Parse(time.RFC3339, f.from); err != nil {
			fmt.Fprintf(stderr, "intake expect: --from: %v\n", err)
			return 2
		}
	}
	for _, p := range cfg.Partners {
		if f.only != "" && p.ID != f.only {
			continue
		}
		found = true
		for i := range p.Feeds {
			fd := &p.Feeds[i]
			if fd.Expect == nil {
				continue
			}
			feeds++
			e := fd.Expect
			cal := "no calendar"
			if e.Calendar != "" {
				cal = "calendar " + e.Calendar
			}
			fmt.Fprintf(stdout, "%s %s: %q in %s, grace %s, %s\n", p.ID, fd.Name, e.Schedule, e.Timezone, e.Grace, cal)
			if strings.HasPrefix(e.Schedule, "@every") {
				fmt.Fprintln(stdout, "  (an @every schedule counts from when intake first evaluated the feed; the times below count from now)")
			}
			for _, w := range expect.Upcoming(e, now, f.count) {
				s, d := w.Scheduled.In(e.Location()), w.Deadline.In(e.Location())
				if w.NoDelivery {
					fmt.Fprintf(stdout, "  %s  no delivery (calendar day)\n", s.Format("Mon 2006-01-02 15:04:05 MST"))
					continue
				}
				fmt.Fprintf(stdout, "  %s  late unless a file is claimed by %s\n", s.Format("Mon 2006-01-02 15:04:05 MST"), d.Format("Mon 2006-01-02 15:04:05 MST"))
			}
		}
	}
	if !found {
		fmt.Fprintf(stderr, "intake expect: no partner %q in %s\n", f.only, f.path)
		return 2
	}
	if feeds == 0 {
		fmt.Fprintln(stdout, "no feed has an expect: block")
	}
	return 0
}

// cmdExpectAck acknowledges a late delivery window: `intake expect ack
// PARTNER/FEED WINDOW --reason …`, WINDOW the window's scheduled time in
// RFC 3339 as `intake status` shows it. The window stops counting as late
// (gauge, status, alert); the acknowledgement is audited.
func cmdExpectAck(f expectFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintf(stderr, "intake expect ack: give the feed and the window first: intake expect ack PARTNER/FEED WINDOW --reason …\ne.g. %s\n", expectAckExample)
		return 2
	}
	partner, feed, ok := strings.Cut(args[0], "/")
	if !ok || partner == "" || feed == "" {
		fmt.Fprintf(stderr, "intake expect ack: %q is not PARTNER/FEED\n", inert.Text(args[0]))
		return 2
	}
	window, err := time.Parse(time.RFC3339, args[1])
	if err != nil {
		fmt.Fprintf(stderr, "intake expect ack: window %q is not an RFC 3339 time (the scheduled time intake status shows, e.g. 2026-12-01T06:00:00Z)\n", inert.Text(args[1]))
		return 2
	}
	if strings.TrimSpace(f.reason) == "" || strings.TrimSpace(f.actor) == "" {
		fmt.Fprintln(stderr, "intake expect ack: --reason and --actor must not be empty")
		return 2
	}
	ctx, e, _, done, code := openScoped(f.path, partner, stderr)
	if e == nil {
		return code
	}
	defer done()
	if !hasFeed(e.cfg.Partners, partner, feed) {
		fmt.Fprintf(stderr, "intake expect ack: partner %s has no feed %q in %s\n", partner, inert.Text(feed), f.path)
		return 2
	}
	request := newRequestID()
	subject := fmt.Sprintf("window %s/%s %s", partner, feed, window.UTC().Format(time.RFC3339))
	fmt.Fprintf(stdout, "%s: ack by %s, request %s\n", subject, inert.Text(f.actor), request)
	actingAs(ctx, e, f.actor, stdout)
	var w ledger.LateWindow
	err = act(func() (err error) {
		w, err = ops.AckLate(ctx, e.pool, partner, feed, window, f.actor, f.reason, request)
		return err
	})
	if err != nil {
		if code := actionFailed(ctx, e.pool, stderr, "expect ack", subject, request, "acknowledging it again is refused then, for it is acknowledged", err); code != 0 {
			return code
		}
		fmt.Fprintf(stdout, "late window of %s/%s scheduled %s acknowledged by %s; it no longer counts as late\n",
			partner, feed, window.UTC().Format(time.RFC3339), inert.Text(f.actor))
		return 0
	}
	fmt.Fprintf(stdout, "late window of %s/%s scheduled %s (deadline %s) acknowledged by %s; it no longer counts as late\n",
		partner, feed, w.Scheduled.UTC().Format(time.RFC3339), w.Deadline.UTC().Format(time.RFC3339), inert.Text(f.actor))
	return 0
}

const expectAckExample = `intake expect ack acme/orders 2026-12-01T06:00:00Z --config /etc/intake/intake.yaml --reason "partner confirmed no orders that day"`

func hasFeed(parts []partners.Config, partner, feed string) bool {
	for _, p := range parts {
		if p.ID != partner {
			continue
		}
		for _, f := range p.Feeds {
			if f.Name == feed {
				return true
			}
		}
	}
	return false
}
