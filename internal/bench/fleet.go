package bench

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fleet measures one daemon serving many partners on one OpenSSH: each
// partner its own root under the bench account, all polled
// on FleetPoll (`@every 30s`), phased over the interval by the daemon's
// session policy (intake/sessions.go). In one daemon run:
//
//   - first cycle: from the daemon's exec until every partner has a
//     successful poll recorded in intake_partner_poll (SSH logins bounded
//     by sessions.max_parallel_dials; sshd's CPU per login beside it), and
//     the part of it before the daemon registered (its own start); the CPU
//     the daemon, sshd and PostgreSQL used meanwhile, and the share of the
//     machine's CPU time that was busy (1: the cycle waited for CPU);
//   - idle cycle: the CPU the daemon, sshd and PostgreSQL use over one
//     poll interval with every session open and nothing to take, the
//     second such interval after the first cycle (the first, reported
//     beside it, still carries the logins' aftermath);
//   - latency: FleetFiles files dropped into ready/ of random partners at
//     random moments over FleetWindow, each timed from its rename into
//     ready/ to its archive (file_intake.finished_at);
//   - the daemon's peak RSS (VmHWM) at the end, every session open.
func (e *replicaRuns) fleet(ctx context.Context, res *Results) error {
	n, poll := e.o.FleetPartners, e.o.FleetPoll
	url, err := e.database(ctx)
	if err != nil {
		return err
	}
	e.say("fleet: %d partners @every %s on one sshd, %d files over %s", n, poll, e.o.FleetFiles, e.o.FleetWindow)
	roots, order, err := e.partnerSites("f", n)
	if err != nil {
		return err
	}
	opsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	cfg, err := e.configDaemon(daemonConfig{worker: "fleet-1", lease: 2 * time.Minute, reconcile: time.Hour, spool: filepath.Join(e.dir, "spool"),
		extra: e.o.FleetYAML, http: opsAddr}, roots, order, fmt.Sprintf("@every %s", poll))
	if err != nil {
		return err
	}
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer watch.Close(ctx)
	quiet()
	pgStart, sshdStart, err := e.serverCPU()
	if err != nil {
		return err
	}
	busyStart, allStart, err := machineCPU()
	if err != nil {
		return err
	}
	p, err := e.start(url, cfg, "run")
	if err != nil {
		return err
	}
	defer p.kill()
	res.FleetPartners, res.FleetFiles, res.FleetPollS = n, e.o.FleetFiles, poll.Seconds()

	// first cycle: every partner polled once, successfully
	deadline := time.Now().Add(max(3*time.Minute, 3*poll))
	for {
		var ok, failed int
		var last time.Time
		if err := watch.QueryRow(ctx, `SELECT count(last_ok_at), count(last_error_at), coalesce(max(last_ok_at), now())
			FROM intake_partner_poll WHERE worker_id = 'fleet-1'`).Scan(&ok, &failed, &last); err != nil {
			return err
		}
		res.FleetPollErrors = failed
		if ok >= n {
			res.FleetFirstCycleS = last.Sub(p.start).Seconds()
			break
		}
		if p.exited() {
			_, _, _, err := p.wait()
			return fmt.Errorf("the daemon ended before its first cycle: %v", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("first cycle: %d of %d partners polled (%d with errors) after %s", ok, n, failed, time.Since(p.start).Round(time.Second))
		}
		time.Sleep(250 * time.Millisecond)
	}
	// the daemon's own start (config, schema and target checks) up to its
	// registration, which comes right before the first polls are scheduled
	var started time.Time
	if err := watch.QueryRow(ctx, `SELECT started_at FROM intake_worker WHERE worker_id = 'fleet-1'`).Scan(&started); err != nil {
		return err
	}
	res.FleetStartS = started.Sub(p.start).Seconds()
	pgFirst, sshdFirst, err := e.serverCPU()
	if err != nil {
		return err
	}
	daemonFirst, err := treeCPU(p.cmd.Process.Pid)
	if err != nil {
		return err
	}
	busyFirst, allFirst, err := machineCPU()
	if err != nil {
		return err
	}
	if res.FleetLogins, err = e.sshd.Connections(); err != nil {
		return err
	}
	res.FleetSSHDCPUmsPerPartner = (sshdFirst - sshdStart) / float64(n) * 1000
	res.FleetSSHDCPUmsPerLogin = (sshdFirst - sshdStart) / float64(max(res.FleetLogins, 1)) * 1000
	// The first cycle's CPU by process tree, and how busy the machine's
	// cores were meanwhile: here the partners' sshd shares the daemon's
	// cores, and no schedule ends the cycle sooner than its logins' CPU
	// allows (on a real fleet each site logs in on its own machine).
	res.FleetFirstCycleCPUS = map[string]float64{"intake": daemonFirst, "sshd": sshdFirst - sshdStart, "postgres": pgFirst - pgStart}
	res.FleetFirstCycleBusy = (busyFirst - busyStart) / (allFirst - allStart)
	res.FleetRSSFirstMiB = vmKiB(p.cmd.Process.Pid, "VmRSS") / 1024
	if m, err := scrape(ctx, "http://"+opsAddr+"/metrics", "go_goroutines", "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes"); err == nil {
		res.FleetGoroutines, res.FleetHeapInuseMiB, res.FleetStackInuseMiB = m[0], m[1]/(1<<20), m[2]/(1<<20)
	} else {
		e.say("fleet: the daemon's /metrics not read: %v", err)
	}
	e.say("fleet: start %.1f s, first cycle %.1f s, RSS %.0f MiB (heap %.0f, stacks %.0f MiB, %.0f goroutines)", res.FleetStartS, res.FleetFirstCycleS,
		res.FleetRSSFirstMiB, res.FleetHeapInuseMiB, res.FleetStackInuseMiB, res.FleetGoroutines)

	// idle cycles: two poll intervals, nothing to take. The first still
	// carries the logins' aftermath (the collection of their garbage, the
	// sessions settling); the second is the fleet's steady cost.
	quiet()
	type cpus struct{ pg, sshd, daemon float64 }
	read := func() (c cpus, err error) {
		if c.pg, c.sshd, err = e.serverCPU(); err != nil {
			return c, err
		}
		c.daemon, err = treeCPU(p.cmd.Process.Pid)
		return c, err
	}
	c0, err := read()
	if err != nil {
		return err
	}
	time.Sleep(poll)
	c1, err := read()
	if err != nil {
		return err
	}
	time.Sleep(poll)
	c2, err := read()
	if err != nil {
		return err
	}
	res.FleetIdleFirstCPUS = c1.daemon - c0.daemon
	res.FleetIdleCPUS, res.FleetIdleSSHDCPUS, res.FleetIdlePGCPUS = c2.daemon-c1.daemon, c2.sshd-c1.sshd, c2.pg-c1.pg

	// latency: files appear at random partners at random moments
	rng := rand.New(rand.NewSource(17))
	type drop struct {
		at      time.Duration
		partner string
		name    string
	}
	drops := make([]drop, e.o.FleetFiles)
	for i := range drops {
		drops[i] = drop{at: time.Duration(rng.Int63n(int64(e.o.FleetWindow))), partner: order[rng.Intn(n)], name: fmt.Sprintf("orders-fleet-%05d.csv", i)}
	}
	sort.Slice(drops, func(i, j int) bool { return drops[i].at < drops[j].at })
	appeared := map[string]time.Time{} // partner/name -> rename into ready/
	t0 := time.Now()
	for i, d := range drops {
		time.Sleep(time.Until(t0.Add(d.at)))
		part := filepath.Join(roots[d.partner], "incoming", d.name+".part")
		if _, err := writeCSV(part, e.o.SmallRows, 1_000_000+i*e.o.SmallRows); err != nil {
			return err
		}
		if err := os.Rename(part, filepath.Join(roots[d.partner], "ready", d.name)); err != nil {
			return err
		}
		appeared[d.partner+"/"+d.name] = time.Now()
	}
	deadline = time.Now().Add(2*poll + 30*time.Second)
	for {
		var done int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM file_intake WHERE state = 'archived'`).Scan(&done); err != nil {
			return err
		}
		if done >= len(drops) {
			break
		}
		if p.exited() {
			_, _, _, err := p.wait()
			return fmt.Errorf("the daemon ended with %d of %d files archived: %v", done, len(drops), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d files archived two poll intervals after the last drop", done, len(drops))
		}
		time.Sleep(250 * time.Millisecond)
	}
	rows, err := watch.Query(ctx, `SELECT partner_id, remote_name, finished_at FROM file_intake WHERE state = 'archived'`)
	if err != nil {
		return err
	}
	var lat []float64
	for rows.Next() {
		var partner, name string
		var fin time.Time
		if err := rows.Scan(&partner, &name, &fin); err != nil {
			return err
		}
		if at, ok := appeared[partner+"/"+name]; ok {
			lat = append(lat, fin.Sub(at).Seconds())
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(lat) != len(drops) {
		return fmt.Errorf("%d archived files matched the %d dropped", len(lat), len(drops))
	}
	sort.Float64s(lat)
	res.FleetLatencyP50S, res.FleetLatencyP99S, res.FleetLatencyMaxS = rank(lat, 0.50), rank(lat, 0.99), lat[len(lat)-1]

	res.FleetRSSMiB = vmKiB(p.cmd.Process.Pid, "VmHWM") / 1024
	p.cmd.Process.Signal(syscall.SIGTERM)
	if _, _, _, err := p.wait(); err != nil {
		return err
	}
	rowsIn, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err != nil {
		return err
	}
	if want := int64(len(drops) * e.o.SmallRows); rowsIn != want {
		return fmt.Errorf("fleet: %d rows in the target, want %d", rowsIn, want)
	}
	return nil
}

// rank is the nearest-rank quantile q of sorted v.
func rank(v []float64, q float64) float64 {
	i := int(q*float64(len(v))+0.999999) - 1
	return v[min(max(i, 0), len(v)-1)]
}

// vmKiB reads a kB field of /proc/<pid>/status (VmRSS, VmHWM); 0 if absent.
func vmKiB(pid int, field string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return v
		}
	}
	return 0
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// scrape reads the values of the unlabelled gauges names from the
// Prometheus text exposition at url, in that order.
func scrape(ctx context.Context, url string, names ...string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(names))
	for i, n := range names {
		f, ok := fams[n]
		if !ok || len(f.GetMetric()) != 1 {
			return nil, fmt.Errorf("%s: no single sample %s", url, n)
		}
		out[i] = f.GetMetric()[0].GetGauge().GetValue()
	}
	return out, nil
}
