package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"
)

// wanRuns measures the large and small workloads behind the latency
// proxy.
type wanRuns struct{ *env }

// wan measures intake and the naive pipeline with SFTP through a latency
// proxy (Options.WANDelay each way; the database stays local): the large
// file fresh, the naive pipeline's sftp get of it through the same proxy
// plus the rest, and the small files with one warm daemon. It also counts the round trips paid one after another on the
// small-file path (wanProxy.turns).
func (e *wanRuns) wanWorkload(ctx context.Context, res *Results) error {
	p, err := newWANProxy(e.sshd.Addr, e.o.WANDelay)
	if err != nil {
		return err
	}
	defer p.Close()
	kh := filepath.Join(e.dir, "known_hosts_wan")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{p.Addr()}, e.sshd.HostKey)+"\n"), 0o600); err != nil {
		return err
	}
	e.wan, e.wanKnownHosts = p, kh
	defer func() { e.wan, e.wanKnownHosts = nil, "" }()
	res.WANRTTms = float64(2*e.o.WANDelay) / 1e6
	e.say("WAN: SFTP through a proxy adding %v each way", e.o.WANDelay)

	// The large file, fresh, Options.Repeat times (each on a database of
	// its own): medians, as for the loopback figures.
	var runs []*Results
	for i := 0; i < max(e.o.Repeat, 1); i++ {
		r := &Results{}
		if err := e.wanLarge(ctx, p, r); err != nil {
			return err
		}
		runs = append(runs, r)
	}
	medians(res, runs,
		func(r *Results) *float64 { return &r.WANNaiveLargeS },
		func(r *Results) *float64 { return &r.WANLargeS },
		func(r *Results) *float64 { return &r.WANRatioNaive },
		func(r *Results) *float64 { return &r.WANLargeProxyCPUS })
	mid := runs[len(runs)/2]
	res.WANLargeTurns, res.WANNaiveLargeTurns = mid.WANLargeTurns, mid.WANNaiveLargeTurns
	if len(runs) > 1 {
		for _, r := range runs {
			res.WANLargeRuns = append(res.WANLargeRuns, r.WANLargeS)
		}
	}

	if res.WANDialMs, err = e.dialMs(ctx); err != nil {
		return fmt.Errorf("WAN dial time: %w", err)
	}
	if e.o.SmallFiles > 0 {
		before := p.Turns()
		ph, err := e.smallRun(ctx, 1, true)
		if err != nil {
			return fmt.Errorf("WAN small files: %w", err)
		}
		res.WANSmallFilesPerS = ph.filesPerS
		res.DoubleApplies += ph.doubles
		// every turn of the phase, warm-up and settling included, over
		// the measured files: an upper bound of the burst's own
		res.WANSmallTurnsPerFile = float64(p.Turns()-before) / float64(e.o.SmallFiles)
		n := float64(e.o.SmallFiles)
		res.WANSmallBurstTurnsPerFile = float64(ph.turns) / n
		res.WANSmallCPUms = map[string]float64{"intake": ph.cpu[0] * 1000 / n, "postgres": ph.pgCPU * 1000 / n, "sshd": ph.sshdCPU * 1000 / n}
	}
	return nil
}

// wanLarge is one run of the large file through the proxy: the naive
// pipeline, then intake fresh, on a database of its own. It also measures
// the bench process's own CPU while intake runs, which is the proxy's
// (on a two-core machine it competes with what is measured; a real link
// takes no CPU from the daemon's host).
func (e *wanRuns) wanLarge(ctx context.Context, p *wanProxy, res *Results) error {
	var size int64
	url, root, cfg, src, err := e.largeSetup(ctx, &size)
	if err != nil {
		return err
	}
	if err := copyFile(src, filepath.Join(root, "ready", "orders-naive.csv")); err != nil {
		return err
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	t0 := p.Turns()
	if res.WANNaiveLargeS, err = e.naive(url, root, "orders-naive.csv", "naive-1"); err != nil {
		return err
	}
	res.WANNaiveLargeTurns = p.Turns() - t0
	os.Remove(filepath.Join(root, "ready", "orders-naive.csv"))
	if err := copyFile(src, filepath.Join(root, "ready", "orders-large.csv")); err != nil {
		return err
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	t0 = p.Turns()
	cpu0 := selfCPU()
	if res.WANLargeS, _, _, err = e.runOnce(url, cfg); err != nil {
		return err
	}
	res.WANLargeProxyCPUS = selfCPU() - cpu0
	res.WANLargeTurns = p.Turns() - t0
	rows, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err != nil {
		return err
	}
	if rows != int64(e.o.LargeRows) {
		return fmt.Errorf("WAN large file: %d rows in the target, want %d", rows, e.o.LargeRows)
	}
	res.WANRatioNaive = res.WANLargeS / res.WANNaiveLargeS
	return nil
}

// selfCPU is this process's CPU seconds so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
