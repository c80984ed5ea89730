package backpressure

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake/metrics"
	"github.com/partner-intake/partner-intake/spool"
)

func guard(t *testing.T, minFree *int64) *Guard {
	t.Helper()
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &Guard{Spool: sp, MinFree: minFree, Metrics: metrics.New(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// Below the free-space floor nothing is claimed, and the gauge says so;
// with room again claiming resumes.
func TestSpaceOKFollowsTheFloor(t *testing.T) {
	floor := int64(1 << 62)
	g := guard(t, &floor)
	if g.SpaceOK() || testutil.ToFloat64(g.Metrics.Backpressure) != 1 {
		t.Fatalf("below the floor: claiming, gauge %v", testutil.ToFloat64(g.Metrics.Backpressure))
	}
	floor = 0
	if !g.SpaceOK() || testutil.ToFloat64(g.Metrics.Backpressure) != 0 {
		t.Fatalf("above the floor: not claiming, gauge %v", testutil.ToFloat64(g.Metrics.Backpressure))
	}
}

// A partner's claims stop once its spooled and claimed bytes reach the
// quota, and go on at the next poll's quota
// when the spool holds less again; no quota, no limit.
func TestQuotaStopsAtItsBytes(t *testing.T) {
	var floor int64
	g := guard(t, &floor)
	var full atomic.Bool
	q, err := g.Quota("p1", 10, &full)
	if err != nil || !q.OK() {
		t.Fatalf("empty spool: %v, ok %v", err, q.OK())
	}
	q.Claimed(6)
	if !q.OK() || full.Load() {
		t.Fatal("6 of 10 bytes: claims stopped")
	}
	q.Claimed(4)
	gauge := g.Metrics.QuotaFull.WithLabelValues("p1")
	if q.OK() || !full.Load() || testutil.ToFloat64(gauge) != 1 {
		t.Fatalf("10 of 10 bytes: ok %v, full %v, gauge %v", q.OK(), full.Load(), testutil.ToFloat64(gauge))
	}
	if q, err = g.Quota("p1", 10, &full); err != nil || !q.OK() || full.Load() || testutil.ToFloat64(gauge) != 0 {
		t.Fatalf("next poll, empty spool: %v, ok %v, full %v", err, q.OK(), full.Load())
	}
	q, _ = g.Quota("p2", 0, new(atomic.Bool))
	if q.Claimed(1 << 40); !q.OK() {
		t.Fatal("no quota: claims stopped")
	}
}
