package partners

import "time"

// HeardSince is Session.heardSince: the keepalive skips its request when
// this holds for the last interval.
func HeardSince(s *Session, t time.Time) bool { return s.heardSince(t) }

// OneSubsystemFallbacks is how many dials were made again with the main
// channel alone for a site that starts one sftp subsystem a connection.
func OneSubsystemFallbacks() int64 { return oneSubsystemFallbacks.Load() }
