package partners

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Expect says when a feed's files are due. Each time the
// schedule fires (in Timezone) a delivery is due; a day listed in the
// Calendar file expects none. docs/design.md "Expected deliveries" defines
// the window and how files are counted.
type Expect struct {
	// Schedule is a cron spec: five fields ("0 6 * * MON-FRI"), six with
	// seconds first ("30 0 6 * * *"), or a descriptor ("@daily",
	// "@every 2h"; an @every schedule counts from when intake first
	// evaluated the feed).
	Schedule string `yaml:"schedule"`
	// Timezone is an IANA zone ("Europe/Berlin"); default UTC. The
	// schedule's fields and the calendar's dates are read in it.
	Timezone string `yaml:"timezone"`
	// Grace is how long after the scheduled time a file may still arrive
	// on time (default 0: due at the scheduled time).
	Grace time.Duration `yaml:"grace"`
	// Calendar is a file of days without delivery: one ISO date
	// (YYYY-MM-DD, a local date in Timezone) per line; blank lines and
	// text after '#' are ignored. Read when the config is (re)loaded.
	Calendar string `yaml:"calendar"`

	sched cron.Schedule
	loc   *time.Location
	days  map[string]bool
}

// maxCalendarBytes bounds a calendar file (a century of days fits).
const maxCalendarBytes = 1 << 20

var expectParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Validate parses the schedule, loads the time zone and reads the calendar.
func (e *Expect) Validate(key string) error {
	if e.Timezone == "" {
		e.Timezone = "UTC"
	}
	loc, err := time.LoadLocation(e.Timezone)
	if err != nil {
		return fmt.Errorf("%s.timezone: %q: %v", key, e.Timezone, err)
	}
	e.loc = loc
	if strings.HasPrefix(strings.TrimSpace(e.Schedule), "CRON_TZ=") || strings.HasPrefix(strings.TrimSpace(e.Schedule), "TZ=") {
		return fmt.Errorf("%s.schedule: set the zone with timezone, not in the spec", key)
	}
	s, err := expectParser.Parse(e.Schedule)
	if err != nil {
		return fmt.Errorf("%s.schedule: %q: %v", key, e.Schedule, err)
	}
	if spec, ok := s.(*cron.SpecSchedule); ok {
		spec.Location = loc
	}
	e.sched = s
	if e.Grace < 0 || e.Grace > 31*24*time.Hour {
		return fmt.Errorf("%s.grace: %s must be between 0 and 744h", key, e.Grace)
	}
	e.days = map[string]bool{}
	if e.Calendar != "" {
		days, err := readCalendar(e.Calendar)
		if err != nil {
			return fmt.Errorf("%s.calendar: %v", key, err)
		}
		e.days = days
	}
	return nil
}

func readCalendar(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCalendarBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxCalendarBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxCalendarBytes)
	}
	days := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		s := sc.Text()
		if i := strings.IndexByte(s, '#'); i >= 0 {
			s = s[:i]
		}
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		d, err := time.Parse(time.DateOnly, s)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: not a date as YYYY-MM-DD", path, line)
		}
		days[d.Format(time.DateOnly)] = true
	}
	return days, sc.Err()
}

// Location is the time zone of the schedule and calendar.
func (e *Expect) Location() *time.Location { return e.loc }

// Next is the first scheduled time after t (zero if the schedule never fires).
func (e *Expect) Next(t time.Time) time.Time { return e.sched.Next(t.In(e.loc)) }

// NoDelivery reports whether the scheduled time s falls on a calendar day.
func (e *Expect) NoDelivery(s time.Time) bool {
	return e.days[s.In(e.loc).Format(time.DateOnly)]
}

// Deadline is when the window of the scheduled time s closes: s + grace.
func (e *Expect) Deadline(s time.Time) time.Time { return s.Add(e.Grace) }
