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

// Next is the first scheduled time after t (zero if the schedule never
// fires). A cron spec is matched against wall-clock times in Timezone, so
// across a daylight-saving change each wall time is expected at most once:
// a time that does not exist on the spring-forward day (02:30 in
// Europe/Berlin) is expected at the first instant after the gap (03:00
// local), and one that occurs twice on the fall-back day is expected at its
// first occurrence only. (cron's own Next steps through absolute hours, so
// it skips the first and fires twice for the second.)
func (e *Expect) Next(t time.Time) time.Time {
	spec, ok := e.sched.(*cron.SpecSchedule)
	if !ok {
		return e.sched.Next(t.In(e.loc))
	}
	wallSpec := *spec
	wallSpec.Location = time.UTC
	w := wall(t.In(e.loc))
	for n := 0; n < 4; n++ {
		next := wallSpec.Next(w)
		if next.IsZero() {
			return next
		}
		r := time.Date(next.Year(), next.Month(), next.Day(), next.Hour(), next.Minute(), next.Second(), 0, e.loc)
		switch start, end := r.ZoneBounds(); {
		case wall(r).Before(next):
			// next's wall time is in a spring-forward gap and r before
			// it: the gap ends where r's zone does.
			r = end
		case wall(r).After(next):
			// in a gap, r after it: the gap ends where r's zone begins.
			r = start
		case !start.IsZero():
			// a repeated wall time: its first occurrence is in the zone
			// before r's, when it has the same wall time there.
			_, off := r.Zone()
			_, prevOff := start.Add(-time.Second).Zone()
			if first := r.Add(time.Duration(off-prevOff) * time.Second); first.Before(start) && wall(first.In(e.loc)).Equal(next) {
				r = first
			}
		}
		if r.After(t) {
			return r
		}
		// r is the first occurrence of a repeated wall time and is past:
		// so are all wall times repeated after it, up to the end of the
		// repeat.
		w = next
		if _, end := r.ZoneBounds(); !end.IsZero() {
			_, before := r.Zone()
			_, after := end.Zone()
			if skip := wall(end.In(e.loc)).Add(time.Duration(before-after)*time.Second - time.Second); skip.After(w) {
				w = skip
			}
		}
	}
	return time.Time{}
}

// wall is t's wall-clock time in its location, as a UTC time.
func wall(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
}

// NoDelivery reports whether the scheduled time s falls on a calendar day.
func (e *Expect) NoDelivery(s time.Time) bool {
	return e.days[s.In(e.loc).Format(time.DateOnly)]
}

// Deadline is when the window of the scheduled time s closes: s + grace.
func (e *Expect) Deadline(s time.Time) time.Time { return s.Add(e.Grace) }
