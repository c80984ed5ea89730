package intake

import (
	"context"
	"math/rand/v2"
	"time"
)

// jitter spreads d over [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// everyTick calls fn every interval until ctx ends or fn returns false:
// the loop of the heartbeats (a file's, a group's, the replica's).
func everyTick(ctx context.Context, interval time.Duration, fn func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !fn() {
				return
			}
		}
	}
}
