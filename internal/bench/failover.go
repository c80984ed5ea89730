package bench

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// failoverReplicas is how many daemons the failover workload runs.
const failoverReplicas = 3

// replicaRuns measures replicas together: a fleet sharing partners, and
// a failover.
type replicaRuns struct{ *env }

// failover measures a failover under load: three replicas with affinity
// partner (each partner polled by one live replica) over FailoverPartners
// partners on one database and one sshd, each replica with a spool of its
// own, the reconciler every FailoverLease/3. Files are dropped at random
// partners at a steady rate over FailoverWindow; a quarter into it one
// replica is SIGKILLed. Figures:
//
//   - failover: for each partner the killed replica polled last (its
//     orphans), the time from the kill until a survivor's successful poll
//     of it is recorded (intake_partner_poll, written once a second),
//     p50/p99/max;
//   - latency: every file from its rename into ready/ to its archive
//     (file_intake.finished_at), p99 and max, across the failover;
//   - lost and duplicated: rows in the target against the rows dropped,
//     and files archived more than once.
//
// Targets: every orphan polled again within lease + one poll interval;
// p99 latency within lease + poll interval + 5 s; none lost, none
// duplicated.
func (e *replicaRuns) failover(ctx context.Context, res *Results) error {
	n, poll, lease := e.o.FailoverPartners, e.o.FailoverPoll, e.o.FailoverLease
	url, err := e.database(ctx)
	if err != nil {
		return err
	}
	e.say("failover: %d partners @every %s, %d replicas, lease %s, %d files over %s, one replica killed a quarter in",
		n, poll, failoverReplicas, lease, e.o.FailoverFiles, e.o.FailoverWindow)
	roots, order, err := e.partnerSites("fo", n)
	if err != nil {
		return err
	}
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer watch.Close(ctx)
	var procs []*proc
	defer func() { killAll(procs) }()
	for i := 1; i <= failoverReplicas; i++ {
		d := daemonConfig{worker: fmt.Sprintf("fo-%d", i), lease: lease, reconcile: max(lease/3, time.Second),
			spool: filepath.Join(e.dir, fmt.Sprintf("spool-fo-%d", i))}
		cfg, err := e.configDaemon(d, roots, order, fmt.Sprintf("@every %s", poll))
		if err != nil {
			return err
		}
		p, err := e.start(url, cfg, "run")
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	res.FailoverPartners, res.FailoverFiles, res.FailoverPollS, res.FailoverLeaseS = n, e.o.FailoverFiles, poll.Seconds(), lease.Seconds()

	// every partner polled, and the replicas settled on who polls which
	// (each partner's last poll by one replica for a whole interval)
	deadline := time.Now().Add(max(3*time.Minute, 4*poll))
	for {
		var polled int
		if err := watch.QueryRow(ctx, `SELECT count(DISTINCT partner_id) FROM intake_partner_poll
			WHERE last_ok_at IS NOT NULL`).Scan(&polled); err != nil {
			return err
		}
		if polled >= n {
			break
		}
		if err := endedEarly(procs, "before the first cycle"); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("first cycle: %d of %d partners polled", polled, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(poll + 2*time.Second) // one whole interval under the settled affinity

	// files at a steady rate over the window; the kill a quarter in
	rng := rand.New(rand.NewSource(23))
	files := e.o.FailoverFiles
	step := e.o.FailoverWindow / time.Duration(max(files, 1))
	appeared := map[string]time.Time{}
	atPartner := map[string]string{} // partner/name -> partner
	victim := procs[1]
	const victimID = "fo-2"
	var killed time.Time
	var orphans []string
	// back: each orphan's first successful poll by a survivor after the
	// kill, watched from the kill on (a later poll overwrites last_ok_at)
	back := make(chan map[string]time.Time, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	t0 := time.Now()
	for i := 0; i < files; i++ {
		at := t0.Add(time.Duration(i) * step)
		if killed.IsZero() && !at.Before(t0.Add(e.o.FailoverWindow/4)) {
			// the orphans: the partners whose latest successful poll is
			// the victim's
			rows, err := watch.Query(ctx, `SELECT DISTINCT ON (partner_id) partner_id, worker_id FROM intake_partner_poll
				WHERE last_ok_at IS NOT NULL ORDER BY partner_id, last_ok_at DESC`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var partner, worker string
				if err := rows.Scan(&partner, &worker); err != nil {
					return err
				}
				if worker == victimID {
					orphans = append(orphans, partner)
				}
			}
			if err := rows.Err(); err != nil {
				return err
			}
			victim.cmd.Process.Signal(syscall.SIGKILL)
			<-victim.done
			killed = time.Now()
			e.say("failover: %s SIGKILLed polling %d partners", victimID, len(orphans))
			go watchOrphans(wctx, url, orphans, victimID, killed, back)
		}
		time.Sleep(time.Until(at))
		partner := order[rng.Intn(n)]
		name := fmt.Sprintf("orders-fo-%05d.csv", i)
		part := filepath.Join(roots[partner], "incoming", name+".part")
		if _, err := writeCSV(part, e.o.SmallRows, 2_000_000+i*e.o.SmallRows); err != nil {
			return err
		}
		if err := os.Rename(part, filepath.Join(roots[partner], "ready", name)); err != nil {
			return err
		}
		appeared[partner+"/"+name] = time.Now()
		atPartner[partner+"/"+name] = partner
	}
	if killed.IsZero() {
		return fmt.Errorf("no replica was killed: the window holds no file after its first quarter")
	}
	res.FailoverOrphans = len(orphans)

	// each orphan's first poll by a survivor after the kill
	var first map[string]time.Time
	select {
	case first = <-back:
	case <-time.After(2*lease + 3*poll + 30*time.Second):
		stopWatch()
		first = <-back
		return fmt.Errorf("%d of %d orphaned partners polled by a survivor %s after the kill", len(first), len(orphans), time.Since(killed).Round(time.Second))
	}
	// the survivors' failed polls since the kill, and why
	errs, err := watch.Query(ctx, `SELECT coalesce(left(last_error, 160), ''), count(*) FROM intake_partner_poll
		WHERE worker_id <> $1 AND last_error_at > $2 GROUP BY 1 ORDER BY 2 DESC`, victimID, killed)
	if err != nil {
		return err
	}
	for errs.Next() {
		var why string
		var k int
		if err := errs.Scan(&why, &k); err != nil {
			return err
		}
		res.FailoverPollErrors += k
		e.say("failover: %d partners' latest poll by a survivor failed: %s", k, why)
	}
	if err := errs.Err(); err != nil {
		return err
	}
	var gaps []float64
	for _, at := range first {
		gaps = append(gaps, at.Sub(killed).Seconds())
	}
	sort.Float64s(gaps)
	if len(gaps) > 0 {
		res.FailoverOrphanP50S, res.FailoverOrphanP99S, res.FailoverOrphanMaxS = rank(gaps, 0.50), rank(gaps, 0.99), gaps[len(gaps)-1]
	}

	// every file archived, once
	deadline = time.Now().Add(2*lease + 3*poll + 30*time.Second)
	for {
		var done int
		if err := watch.QueryRow(ctx, `SELECT count(DISTINCT (partner_id, remote_name)) FROM file_intake WHERE state = 'archived'`).Scan(&done); err != nil {
			return err
		}
		if done >= files {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d files archived %s after the last drop", done, files, (2*lease + 3*poll + 30*time.Second).Round(time.Second))
		}
		time.Sleep(250 * time.Millisecond)
	}
	// a file taken twice is two rows of one name (a takeover keeps its
	// row, under a new fencing token)
	if err := watch.QueryRow(ctx, `SELECT count(*) - count(DISTINCT (partner_id, remote_name)) FROM file_intake`).Scan(&res.FailoverDuplicated); err != nil {
		return err
	}
	rows, err := watch.Query(ctx, `SELECT partner_id, remote_name, min(finished_at) FROM file_intake
		WHERE state = 'archived' GROUP BY partner_id, remote_name`)
	if err != nil {
		return err
	}
	orphaned := map[string]bool{}
	for _, o := range orphans {
		orphaned[o] = true
	}
	var lat, orphanLat []float64
	for rows.Next() {
		var partner, name string
		var fin time.Time
		if err := rows.Scan(&partner, &name, &fin); err != nil {
			return err
		}
		if at, ok := appeared[partner+"/"+name]; ok {
			lat = append(lat, fin.Sub(at).Seconds())
			if orphaned[partner] && at.After(killed) {
				orphanLat = append(orphanLat, fin.Sub(at).Seconds())
			}
		}
	}
	sort.Float64s(orphanLat)
	if len(orphanLat) > 0 {
		res.FailoverOrphanFiles, res.FailoverOrphanFilesP99S = len(orphanLat), rank(orphanLat, 0.99)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sort.Float64s(lat)
	if len(lat) > 0 {
		res.FailoverLatencyP50S, res.FailoverLatencyP99S, res.FailoverLatencyMaxS = rank(lat, 0.50), rank(lat, 0.99), lat[len(lat)-1]
	}
	rowsIn, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err != nil {
		return err
	}
	want := int64(files * e.o.SmallRows)
	res.FailoverRowsLost = max(want-rowsIn, 0)
	e.say("failover: orphans polled again p99 %.1f s after the kill, files p99 %.1f s, %d rows lost, %d files archived twice",
		res.FailoverOrphanP99S, res.FailoverLatencyP99S, res.FailoverRowsLost, res.FailoverDuplicated)
	for _, p := range procs {
		if p != victim {
			p.cmd.Process.Signal(syscall.SIGTERM)
			if _, _, _, err := p.wait(); err != nil {
				return err
			}
		}
	}
	if rowsIn != want {
		return fmt.Errorf("failover: %d rows in the target, want %d", rowsIn, want)
	}
	return nil
}

// watchOrphans sends on back, once every orphan has one, the time of each
// orphan's first successful poll by a replica other than victim after
// killed (intake_partner_poll.last_ok_at, which each poll overwrites:
// read four times a second from the kill on), or what it has when ctx
// ends.
func watchOrphans(ctx context.Context, url string, orphans []string, victim string, killed time.Time, back chan<- map[string]time.Time) {
	got := map[string]time.Time{}
	defer func() { back <- got }()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return
	}
	defer c.Close(context.Background())
	for len(got) < len(orphans) && ctx.Err() == nil {
		rows, err := c.Query(ctx, `SELECT partner_id, min(last_ok_at) FROM intake_partner_poll
			WHERE partner_id = ANY($1) AND worker_id <> $2 AND last_ok_at > $3 GROUP BY partner_id`, orphans, victim, killed)
		if err == nil {
			for rows.Next() {
				var partner string
				var at time.Time
				if rows.Scan(&partner, &at) == nil {
					if _, ok := got[partner]; !ok {
						got[partner] = at
					}
				}
			}
			rows.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}
