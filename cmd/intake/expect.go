package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/cmd/intake/internal/config"
	"github.com/partner-intake/partner-intake/intake/expect"
)

// cmdExpect lists the next delivery windows of every feed with an expect:
// block, calendar days marked, so ops can check a schedule and a calendar
// before they are in force. It reads the config only (no database).
func cmdExpect(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("expect", stderr)
	path := fs.String("config", "", "config file (YAML)")
	only := fs.String("partner", "", "show only this partner")
	count := fs.Int("count", 5, "scheduled times to list per feed (1-100)")
	from := fs.String("from", "", "list the scheduled times after this RFC 3339 time (default: now)")
	if err := parseFlags(fs, args); err != nil {
		return 2
	}
	if *count < 1 || *count > 100 {
		fmt.Fprintln(stderr, "intake expect: --count must be between 1 and 100")
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	now, found, feeds := time.Now(), false, 0
	if *from != "" {
		if now, err = time.Parse(time.RFC3339, *from); err != nil {
			fmt.Fprintf(stderr, "intake expect: --from: %v\n", err)
			return 2
		}
	}
	for _, p := range cfg.Partners {
		if *only != "" && p.ID != *only {
			continue
		}
		found = true
		for i := range p.Feeds {
			f := &p.Feeds[i]
			if f.Expect == nil {
				continue
			}
			feeds++
			e := f.Expect
			cal := "no calendar"
			if e.Calendar != "" {
				cal = "calendar " + e.Calendar
			}
			fmt.Fprintf(stdout, "%s %s: %q in %s, grace %s, %s\n", p.ID, f.Name, e.Schedule, e.Timezone, e.Grace, cal)
			if strings.HasPrefix(e.Schedule, "@every") {
				fmt.Fprintln(stdout, "  (an @every schedule counts from when intake first evaluated the feed; the times below count from now)")
			}
			for _, w := range expect.Upcoming(e, now, *count) {
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
		fmt.Fprintf(stderr, "intake expect: no partner %q in %s\n", *only, *path)
		return 2
	}
	if feeds == 0 {
		fmt.Fprintln(stdout, "no feed has an expect: block")
	}
	return 0
}
