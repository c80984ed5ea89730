package partners

import "time"

// HeardSince is Session.heardSince: the keepalive skips its request when
// this holds for the last interval.
func HeardSince(s *Session, t time.Time) bool { return s.heardSince(t) }
