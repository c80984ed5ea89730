package sftpconn

import (
	"testing"
	"time"
)

// A large upload keeps as many WRITEs in flight as carry uploadRate at
// the site's round trip: one on loopback and a near LAN, a few at a few
// milliseconds, pkg/sftp's bound for a far site and for a round trip not
// measured.
func TestWritesInFlightFollowTheRoundTrip(t *testing.T) {
	const packet = 255 << 10
	for _, c := range []struct {
		rtt  time.Duration
		want int
	}{
		{0, maxInFlight},
		{100 * time.Microsecond, 1},
		{time.Millisecond, 1},
		{5 * time.Millisecond, 5},
		{10 * time.Millisecond, 9},
		{50 * time.Millisecond, maxInFlight},
		{time.Second, maxInFlight},
	} {
		if got := writesInFlight(c.rtt, packet); got != c.want {
			t.Errorf("round trip %v: %d WRITEs in flight, want %d", c.rtt, got, c.want)
		}
	}
	if got := writesInFlight(time.Millisecond, 0); got != maxInFlight {
		t.Errorf("no packet size: %d, want %d", got, maxInFlight)
	}
}
