package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
)

// fileWorkloads measures intake on the file workloads: a large file
// (fresh, replayed, guarded, behind a manifest), many small files, and a
// huge one.
type fileWorkloads struct{ *env }

// large measures the big file: intake fresh, replay (same rows, new batch
// id) and exact duplicate, against the naive pipeline's fresh and replay.
func (e *fileWorkloads) large(ctx context.Context, res *Results) error {
	url, root, cfg, src, err := e.largeSetup(ctx, &res.LargeBytes)
	if err != nil {
		return err
	}
	e.say("large file: %d rows, %.1f MB", e.o.LargeRows, float64(res.LargeBytes)/1e6)
	drop := func(name string) error {
		return copyFile(src, filepath.Join(root, "ready", name))
	}

	// naive first (its table is separate): fresh, then replay
	if err := drop("orders-naive.csv"); err != nil {
		return err
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	if res.NaiveFreshS, err = e.naive(url, root, "orders-naive.csv", "naive-1"); err != nil {
		return err
	}
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	if res.NaiveReplayS, err = e.naive(url, root, "orders-naive.csv", "naive-2"); err != nil {
		return err
	}
	os.Remove(filepath.Join(root, "ready", "orders-naive.csv"))
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	if res.FloorCopyS, err = e.floorCopy(url, src); err != nil {
		return err
	}

	if err := drop("orders-large.csv"); err != nil {
		return err
	}
	if res.LargeFreshS, res.PeakRSSMiB1M, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	// the floor of a replay: the target now holds the file's rows
	if err := e.settle(ctx, url); err != nil {
		return err
	}
	if res.FloorReplayS, err = e.floorReplay(url, src); err != nil {
		return err
	}
	if err := drop("orders-large-again.csv"); err != nil {
		return err
	}
	if res.LargeReplayS, res.PeakRSSMiB1MReplay, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	if err := drop("orders-large.csv"); err != nil {
		return err
	}
	if res.DuplicateS, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	// The same exact resend with a manifest stating its sha256: the
	// partner switched to manifest mode, same id and batch.
	// Decided from the manifest: one small read, not the file.
	if err := e.manifestDuplicate(ctx, url, cfg, src, root, res); err != nil {
		return fmt.Errorf("manifest duplicate: %w", err)
	}
	if res.DialMs, err = e.dialMs(ctx); err != nil {
		return fmt.Errorf("dial time: %w", err)
	}
	states, err := e.count(ctx, url, `SELECT count(*) FROM file_intake WHERE
		(remote_name = 'orders-large.csv' AND state IN ('archived', 'duplicate')) OR (remote_name = 'orders-large-again.csv' AND state = 'archived'
		 AND rows_unchanged = $1)`, e.o.LargeRows)
	if err != nil {
		return err
	}
	rows, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err != nil {
		return err
	}
	naive, err := e.count(ctx, url, `SELECT count(*) FROM naive_orders`)
	if err != nil {
		return err
	}
	wantStates := int64(4)
	if e.o.CompareBinary != "" {
		wantStates += 2 * int64(e.o.CompareRuns) // each compared run is one more duplicate
	}
	res.RowsCheckedOK = states == wantStates && rows == int64(e.o.LargeRows) && naive == int64(e.o.LargeRows)
	if !res.RowsCheckedOK {
		return fmt.Errorf("check failed: %d file outcomes as expected (want %d), %d intake rows, %d naive rows (want %d)", states, wantStates, rows, naive, e.o.LargeRows)
	}
	res.RatioFresh = res.LargeFreshS / res.NaiveFreshS
	res.RatioReplay = res.LargeReplayS / res.NaiveReplayS
	res.RatioDuplicate = res.DuplicateS / res.NaiveReplayS
	res.RatioManifestDuplicate = res.ManifestDuplicateS / res.NaiveReplayS
	res.RatioFloor = res.LargeFreshS / res.FloorCopyS
	res.RatioFloorReplay = res.LargeReplayS / res.FloorReplayS
	if e.o.RowHash {
		return nil // every phase above ran guarded already
	}
	return e.guarded(ctx, url, cfg, drop, res)
}

// guarded measures the concurrent-edit guard's cost: the target emptied
// and given intake_row_hash, the same file fresh (every key new: COPY
// straight in, each row with the hash intake computed) and then again
// (every row unchanged), beside the unguarded fresh and replay.
func (e *fileWorkloads) guarded(ctx context.Context, url, cfg string, drop func(string) error, res *Results) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	_, err = c.Exec(ctx, `TRUNCATE bench_orders; ALTER TABLE bench_orders ADD COLUMN intake_row_hash bigint`)
	c.Close(ctx)
	if err != nil {
		return err
	}
	for _, ph := range []struct {
		name string
		into *float64
	}{{"orders-guarded.csv", &res.GuardFreshS}, {"orders-guarded-again.csv", &res.GuardReplayS}} {
		if err := drop(ph.name); err != nil {
			return err
		}
		if *ph.into, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
			return err
		}
	}
	ok, err := e.count(ctx, url, `SELECT count(*) FROM file_intake WHERE state = 'archived' AND
		((remote_name = 'orders-guarded.csv' AND rows_applied = $1) OR (remote_name = 'orders-guarded-again.csv' AND rows_unchanged = $1))`, e.o.LargeRows)
	if err != nil {
		return err
	}
	hashed, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders WHERE intake_row_hash IS NOT NULL`)
	if err != nil {
		return err
	}
	if ok != 2 || hashed != int64(e.o.LargeRows) {
		return fmt.Errorf("guarded check failed: %d file outcomes as expected (want 2), %d rows with a hash (want %d)", ok, hashed, e.o.LargeRows)
	}
	res.RatioGuardFresh = res.GuardFreshS / res.LargeFreshS
	res.RatioGuardReplay = res.GuardReplayS / res.LargeReplayS
	return nil
}

// manifestDuplicate measures an exact resend of the large file whose
// manifest states its sha256: the daemon's whole run (start, schema
// check, login, poll, the decision, archive and receipt), as duplicate_s,
// and the file's own time from its claim to its end in the ledger.
func (e *fileWorkloads) manifestDuplicate(ctx context.Context, url, cfg, src, root string, res *Results) error {
	b, err := os.ReadFile(cfg)
	if err != nil {
		return err
	}
	mcfg := strings.TrimSuffix(cfg, ".yaml") + "-manifest.yaml"
	const poll = "    poll: \"@every 1s\"\n"
	if !strings.Contains(string(b), poll) {
		return fmt.Errorf("config %s has no poll line to add readiness after", cfg)
	}
	if err := os.WriteFile(mcfg, []byte(strings.Replace(string(b), poll, poll+"    readiness: manifest\n", 1)), 0o600); err != nil {
		return err
	}
	sum, size, err := fileSHA256(src)
	if err != nil {
		return err
	}
	if err := copyFile(src, filepath.Join(root, "ready", "orders-large.csv")); err != nil {
		return err
	}
	man := fmt.Sprintf(`{"bytes": %d, "sha256": %q}`, size, sum)
	if err := os.WriteFile(filepath.Join(root, "ready", "orders-large.csv.complete"), []byte(man), 0o644); err != nil {
		return err
	}
	if res.ManifestDuplicateS, _, _, err = e.settledRun(ctx, url, mcfg); err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var fileS float64
	if err := c.QueryRow(ctx, `SELECT extract(epoch FROM updated_at - claimed_at)::float8
		FROM file_intake WHERE partner_id = 'big' AND remote_name = 'orders-large.csv' AND state = 'duplicate'
		ORDER BY intake_id DESC LIMIT 1`).Scan(&fileS); err != nil {
		return fmt.Errorf("the manifest resend is not a duplicate: %w", err)
	}
	res.ManifestDuplicateFileS = fileS
	if res.FloorSFTPManifestS, err = e.sftpManifestFloor(root, man); err != nil {
		return err
	}
	res.RatioManifestDuplicateFloor = res.ManifestDuplicateS / res.FloorSFTPManifestS
	if e.o.CompareBinary != "" {
		return e.compareManifestDuplicate(ctx, url, mcfg, src, root, man)
	}
	return nil
}

// sftpManifestFloor is the median of 3 runs of OpenSSH's sftp client
// logging in to the partner's site, reading a manifest (man, put back in
// ready/ under a name of its own: intake's run archived the resend's; the
// one small read a manifest decision needs) and leaving: the floor of any
// one-shot process that decides the resend, intake's included.
func (e *baselines) sftpManifestFloor(root, man string) (float64, error) {
	remote := filepath.Join(root, "ready", ".floor-manifest.complete") // a dotfile: no poll takes it
	if err := os.WriteFile(remote, []byte(man), 0o644); err != nil {
		return 0, err
	}
	defer os.Remove(remote)
	batch := filepath.Join(e.dir, "sftp-manifest-batch")
	local := filepath.Join(e.dir, "floor-manifest")
	if err := os.WriteFile(batch, []byte(fmt.Sprintf("get %s %s\n", remote, local)), 0o600); err != nil {
		return 0, err
	}
	args := e.sftpArgs(batch)
	var walls []float64
	for range 3 {
		start := time.Now()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("sftp floor: %v\n%s", err, out)
		}
		walls = append(walls, time.Since(start).Seconds())
	}
	os.Remove(local)
	slices.Sort(walls)
	return walls[1], nil
}

// compareManifestDuplicate runs the manifest duplicate's process
// CompareRuns times with each binary, alternately, and prints the medians.
func (e *fileWorkloads) compareManifestDuplicate(ctx context.Context, url, mcfg, src, root, man string) error {
	main := e.o.IntakeBinary
	defer func() { e.o.IntakeBinary = main }()
	walls := map[string][]float64{}
	for i := 0; i < e.o.CompareRuns; i++ {
		for _, bin := range []string{main, e.o.CompareBinary} {
			if err := copyFile(src, filepath.Join(root, "ready", "orders-large.csv")); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(root, "ready", "orders-large.csv.complete"), []byte(man), 0o644); err != nil {
				return err
			}
			if err := e.settle(ctx, url); err != nil {
				return err
			}
			e.o.IntakeBinary = bin
			wall, _, _, err := e.runOnce(url, mcfg)
			if err != nil {
				return fmt.Errorf("compare %s: %w", bin, err)
			}
			walls[bin] = append(walls[bin], wall)
		}
	}
	for _, bin := range []string{main, e.o.CompareBinary} {
		w := slices.Clone(walls[bin])
		slices.Sort(w)
		e.say("manifest duplicate, %d runs of %s: median %.1f ms (min %.1f, max %.1f)", len(w), bin, 1000*w[len(w)/2], 1000*w[0], 1000*w[len(w)-1])
	}
	return nil
}

// fileSHA256 is the sha256 and size of a local file.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// largeSetup makes a fresh database, the partner "big" with its site and
// config, and the large file (its size in *bytes).
func (e *fileWorkloads) largeSetup(ctx context.Context, bytes *int64) (url, root, cfg, src string, err error) {
	if url, root, err = e.databaseAndSite(ctx, "big"); err != nil {
		return
	}
	if cfg, err = e.config("bench-1", map[string]string{"big": root}, []string{"big"}); err != nil {
		return
	}
	src = filepath.Join(e.dir, "large.csv")
	*bytes, err = writeCSV(src, e.o.LargeRows, 0)
	return
}

// floorCopy is the physical floor of a fresh load: psql \copy of the file,
// already on local disk, straight into an empty table with the target's
// primary key, in one transaction. No download, no hash, no validation, no
// ledger: what PostgreSQL alone needs to take the rows.
func (e *baselines) floorCopy(url, src string) (float64, error) {
	return e.psqlTimed(url, fmt.Sprintf(`\set ON_ERROR_STOP on
BEGIN;
TRUNCATE floor_orders;
\copy floor_orders (order_id, email, amount, status, placed_at, note, qty) FROM '%s' WITH (FORMAT csv, HEADER true)
COMMIT;
`, src))
}

// floorReplay is the floor of a replay: the file staged with \copy into a
// temporary table and compared with the target in one set-based statement
// that writes nothing (the rows that would change: none here).
func (e *baselines) floorReplay(url, src string) (float64, error) {
	return e.psqlTimed(url, fmt.Sprintf(`\set ON_ERROR_STOP on
BEGIN;
CREATE TEMP TABLE stage (order_id text, email text, amount numeric(12,2), status text, placed_at timestamptz, note text, qty integer) ON COMMIT DROP;
\copy stage FROM '%s' WITH (FORMAT csv, HEADER true)
SELECT count(*) FROM stage s LEFT JOIN bench_orders t ON t.partner_id = 'big' AND t.order_id = s.order_id
WHERE t.order_id IS NULL OR (t.email, t.amount, t.status, t.placed_at, t.note, t.qty) IS DISTINCT FROM
      (s.email, s.amount, s.status, s.placed_at, s.note, s.qty);
COMMIT;
`, src))
}

// psqlTimed runs a psql script and returns its wall time.
func (e *env) psqlTimed(url, script string) (float64, error) {
	sf := filepath.Join(e.dir, "script.sql")
	if err := os.WriteFile(sf, []byte(script), 0o600); err != nil {
		return 0, err
	}
	start := time.Now()
	if out, err := exec.Command("psql", url, "-q", "-f", sf).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("psql: %v\n%s", err, out)
	}
	return time.Since(start).Seconds(), nil
}

// settle makes every measured phase start from the same quiet database:
// a checkpoint and VACUUM ANALYZE of both target tables. Without it the
// autovacuum and checkpoint a previous phase's million rows trigger land in
// the next phase at random (measured: intake replay 6.4-9.0 s from run to
// run, naive fresh 6.6-9.2 s).
func (e *env) settle(ctx context.Context, url string) error {
	quiet()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var backend int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	for _, q := range []string{"VACUUM ANALYZE bench_orders", "VACUUM ANALYZE naive_orders", "VACUUM ANALYZE floor_orders", "CHECKPOINT"} {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("settle: %s: %w", q, err)
		}
	}
	if err := c.Close(ctx); err != nil {
		return err
	}
	// The backend's exit is the harness's work too: after VACUUM and
	// CHECKPOINT have touched the shared buffers, tearing its page
	// tables down took 25-36 ms of CPU here, inside the first 40 ms of the
	// phase measured next (a perf timeline of the manifest duplicate).
	if !gone(backend, 5*time.Second) {
		e.say("settle: PostgreSQL backend %d still running 5 s after its connection closed; measuring anyway", backend)
	}
	return nil
}

// gone waits until the local process pid has exited (the bench's
// PostgreSQL runs on this machine), at most wait, and reports whether it
// did.
func gone(pid int, wait time.Duration) bool {
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
	}
	return false
}

// quiet keeps the harness's own work out of the phase it measures: the
// garbage of preparing the workload is collected and returned to the
// system, and the files just written are flushed to disk, before the clock
// starts (it runs on the same two cores as the pipeline).
func quiet() {
	runtime.GC()
	debug.FreeOSMemory()
	syscall.Sync()
}

// sftpArgs is OpenSSH's sftp running batch against the bench's sshd, as
// the naive pipeline runs it (the host key pinned).
func (e *env) sftpArgs(batch string) []string {
	host, port, _ := strings.Cut(e.sshAddr(), ":")
	return []string{"sftp", "-q", "-b", batch, "-i", e.sshd.ClientKeyFile, "-o", "UserKnownHostsFile=" + e.knownHosts(),
		"-o", "StrictHostKeyChecking=yes", "-P", port, e.sshd.User + "@" + host}
}

// baselines measures what intake is compared with: the naive scripted
// pipeline and the floors (a bare COPY, a replay, gpg, an SFTP read).
type baselines struct{ *env }

// naive runs the pipeline a user would script: sftp get, sha256sum, psql
// \copy into a temp table and one guarded upsert.
func (e *baselines) naive(url, root, name, batch string) (float64, error) {
	start := time.Now()
	local := filepath.Join(e.dir, "naive-"+name)
	batchFile := filepath.Join(e.dir, "sftp-batch")
	if err := os.WriteFile(batchFile, []byte(fmt.Sprintf("get %s %s\n", filepath.Join(root, "ready", name), local)), 0o600); err != nil {
		return 0, err
	}
	steps := [][]string{
		e.sftpArgs(batchFile),
		{"sha256sum", local},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s: %v\n%s", s[0], err, out)
		}
	}
	script := fmt.Sprintf(`\set ON_ERROR_STOP on
BEGIN;
CREATE TEMP TABLE stage (order_id text, email text, amount numeric(12,2), status text, placed_at timestamptz, note text, qty integer) ON COMMIT DROP;
\copy stage FROM '%s' WITH (FORMAT csv, HEADER true)
INSERT INTO naive_orders AS t (partner_id, order_id, email, amount, status, placed_at, note, qty, batch_id)
SELECT 'big', order_id, email, amount, status, placed_at, note, qty, '%s' FROM stage
ON CONFLICT (partner_id, order_id) DO UPDATE SET email = EXCLUDED.email, amount = EXCLUDED.amount, status = EXCLUDED.status,
    placed_at = EXCLUDED.placed_at, note = EXCLUDED.note, qty = EXCLUDED.qty, batch_id = EXCLUDED.batch_id
WHERE (t.email, t.amount, t.status, t.placed_at, t.note, t.qty) IS DISTINCT FROM
      (EXCLUDED.email, EXCLUDED.amount, EXCLUDED.status, EXCLUDED.placed_at, EXCLUDED.note, EXCLUDED.qty);
COMMIT;
`, local, batch)
	if _, err := e.psqlTimed(url, script); err != nil {
		return 0, err
	}
	os.Remove(local)
	return time.Since(start).Seconds(), nil
}

// small measures many small files across partners, with one daemon and
// with two sharing the work.
func (e *fileWorkloads) small(ctx context.Context, res *Results) error {
	if e.o.SmallFiles == 0 {
		return nil
	}
	coldOne, err := e.smallRun(ctx, 1, false)
	if err != nil {
		return err
	}
	coldTwo, err := e.smallRun(ctx, 2, false)
	if err != nil {
		return err
	}
	one, err := e.smallRun(ctx, 1, true)
	if err != nil {
		return err
	}
	two, err := e.smallRun(ctx, 2, true)
	if err != nil {
		return err
	}
	res.SmallFilesPerSCold, res.TwoReplicasFilesSCold = coldOne.filesPerS, coldTwo.filesPerS
	res.WarmClaimSpreadS = max(one.spread, two.spread)
	res.ScaleTwoOverOneCold = coldTwo.filesPerS / coldOne.filesPerS
	res.DoubleApplies += coldOne.doubles + coldTwo.doubles
	res.SmallFilesPerS, res.TwoReplicasFilesS, res.CPUOneS, res.CPUTwoS, res.DoubleApplies = one.filesPerS, two.filesPerS, one.cpu[0], two.cpu, res.DoubleApplies+two.doubles+one.doubles
	res.ScaleTwoOverOne = two.filesPerS / one.filesPerS
	res.TwoDaemonFiles = two.byWorker
	n := float64(e.o.SmallFiles) / 1000 // CPU seconds per file, in ms
	res.SmallCPUms = map[string]float64{"intake": one.cpu[0] / n, "postgres": one.pgCPU / n, "sshd": one.sshdCPU / n}
	res.SmallCPUmsCold = map[string]float64{"intake": coldOne.cpu[0] / n, "postgres": coldOne.pgCPU / n, "sshd": coldOne.sshdCPU / n}
	var both float64
	for _, c := range two.cpu {
		both += c
	}
	res.TwoCPUms = map[string]float64{"intake": both / n, "postgres": two.pgCPU / n, "sshd": two.sshdCPU / n}
	return nil
}

// smallPhase is one small-file phase's figures.
type smallPhase struct {
	filesPerS      float64
	cpu            []float64 // per daemon, seconds
	pgCPU, sshdCPU float64   // seconds, during the phase
	doubles        int64
	byWorker       map[string]int64 // files processed per daemon
	spread         float64          // warm: seconds between the partners' first claims
	turns          int64            // warm, through the WAN proxy: round trips paid in sequence during the burst
}

// smallRun runs one small-file phase. Cold: the files are in ready/ when
// the daemons start, and the time runs from their exec to the last file
// archived (process start, schema check and SSH logins included). Warm:
// the daemons are started and settled first (registered, partners split
// between them, sessions open, and two warm-up files per partner taken
// through, so connections and prepared statements exist as in a daemon
// that has been running), then every partner's files appear in
// ready/ at once (incoming/ and ready/ swapped atomically, just before the
// daemons' next poll); the time runs from the first claim to the last
// file archived, as file_intake records them, and CPU is counted over
// that burst only.
func (e *fileWorkloads) smallRun(ctx context.Context, daemons int, warm bool) (ph smallPhase, err error) {
	url, err := e.database(ctx)
	if err != nil {
		return ph, err
	}
	roots := map[string]string{}
	var order []string
	for p := 0; p < e.o.Partners; p++ {
		id := fmt.Sprintf("p%02d", p)
		if roots[id], err = e.partnerSite(id); err != nil {
			return ph, err
		}
		order = append(order, id)
	}
	drop := "ready"
	if warm {
		drop = "incoming"
	}
	for i := 0; i < e.o.SmallFiles; i++ {
		id := order[i%len(order)]
		if _, err := writeCSV(filepath.Join(roots[id], drop, fmt.Sprintf("orders-%05d.csv", i)), e.o.SmallRows, i*e.o.SmallRows); err != nil {
			return ph, err
		}
	}
	mode := "cold"
	if warm {
		mode = "warm"
	}
	e.say("small files (%s): %d files of %d rows over %d partners, %d daemon(s)", mode, e.o.SmallFiles, e.o.SmallRows, e.o.Partners, daemons)
	quiet()
	var procs []*proc
	defer func() { killAll(procs) }()
	pg0, sshd0, err := e.serverCPU()
	if err != nil {
		return ph, err
	}
	start := time.Now()
	for d := 0; d < daemons; d++ {
		cfg, err := e.config(fmt.Sprintf("small-%d", d), roots, order)
		if err != nil {
			return ph, err
		}
		p, err := e.start(url, cfg, "run")
		if err != nil {
			return ph, err
		}
		procs = append(procs, p)
	}
	// one connection for the progress checks: a connection per check
	// would cost PostgreSQL a backend start every time, on the same cores
	watch, err := pgx.Connect(ctx, url)
	if err != nil {
		return ph, err
	}
	defer watch.Close(ctx)
	var daemonCPU0 []float64
	warmups := 0
	if warm {
		if err := e.settleDaemons(ctx, watch, procs); err != nil {
			return ph, err
		}
		// Steady state: two files per partner first (a group of two), so
		// that the connections and prepared statements the burst uses
		// exist, as they do in a daemon that has been running.
		for i, id := range order {
			for k := 0; k < 2; k++ {
				n := e.o.SmallFiles + 2*i + k
				if _, err := writeCSV(filepath.Join(roots[id], "ready", fmt.Sprintf("%s%05d.csv", warmupPrefix, n)), e.o.SmallRows, n*e.o.SmallRows); err != nil {
					return ph, err
				}
				warmups++
			}
		}
		if err := waitArchived(ctx, watch, warmups, procs); err != nil {
			return ph, fmt.Errorf("warm-up files: %w", err)
		}
		quiet()
		// polls run at whole seconds (@every 1s): the files appear just
		// before the next one, for every partner alike
		now := time.Now()
		time.Sleep(now.Truncate(time.Second).Add(time.Second - 150*time.Millisecond).Sub(now))
		if pg0, sshd0, err = e.serverCPU(); err != nil {
			return ph, err
		}
		for _, p := range procs {
			c, err := treeCPU(p.cmd.Process.Pid)
			if err != nil {
				return ph, err
			}
			daemonCPU0 = append(daemonCPU0, c)
		}
		if e.wan != nil {
			ph.turns = -e.wan.Turns()
		}
		for _, id := range order {
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(roots[id], "incoming"), unix.AT_FDCWD, filepath.Join(roots[id], "ready"), unix.RENAME_EXCHANGE); err != nil {
				return ph, fmt.Errorf("swap incoming/ and ready/: %w", err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Minute)
	var done int64
	exited := func() bool {
		for _, p := range procs {
			if p.exited() {
				return true
			}
		}
		return false
	}
	for done < int64(e.o.SmallFiles+warmups) {
		if time.Now().After(deadline) || exited() {
			break // a daemon that ended early reports its error below
		}
		time.Sleep(50 * time.Millisecond)
		if err = watch.QueryRow(ctx, `SELECT count(*) FROM file_intake WHERE state = 'archived'`).Scan(&done); err != nil {
			break
		}
	}
	elapsed := time.Since(start).Seconds()
	if warm && e.wan != nil {
		ph.turns += e.wan.Turns()
	}
	pg1, sshd1, cerr := e.serverCPU()
	if cerr != nil && err == nil {
		err = cerr
	}
	ph.pgCPU, ph.sshdCPU = pg1-pg0, sshd1-sshd0
	if warm {
		for i, p := range procs {
			c, cerr := treeCPU(p.cmd.Process.Pid)
			if cerr != nil && err == nil {
				err = cerr
			}
			ph.cpu = append(ph.cpu, c-daemonCPU0[i])
		}
		if err == nil {
			err = watch.QueryRow(ctx, `SELECT extract(epoch FROM max(finished_at) - min(claimed_at))::float8 FROM file_intake
				WHERE remote_name NOT LIKE $1`, warmupPrefix+"%").Scan(&elapsed)
		}
		if err == nil {
			// how far apart the partners' first claims were: near 0 when
			// every partner's poll saw its files at the same tick
			err = watch.QueryRow(ctx, `SELECT extract(epoch FROM max(first) - min(first))::float8
				FROM (SELECT min(claimed_at) AS first FROM file_intake WHERE remote_name NOT LIKE $1 GROUP BY partner_id) f`,
				warmupPrefix+"%").Scan(&ph.spread)
		}
	}
	for _, p := range procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		_, _, c, werr := p.wait()
		if werr != nil && err == nil {
			err = werr
		}
		if !warm {
			ph.cpu = append(ph.cpu, c)
		}
	}
	if err != nil {
		return ph, err
	}
	if done < int64(e.o.SmallFiles+warmups) {
		return ph, fmt.Errorf("only %d of %d small files archived (a daemon ended early, or 10 minutes passed)", done, e.o.SmallFiles)
	}
	ph.filesPerS = float64(e.o.SmallFiles) / elapsed
	ph.doubles, err = e.count(ctx, url, `SELECT (SELECT count(*) FROM file_intake) - (SELECT count(DISTINCT (partner_id, remote_name)) FROM file_intake)
		+ (SELECT count(*) FROM bench_orders) - $1`, int64((e.o.SmallFiles+warmups)*e.o.SmallRows))
	if err != nil {
		return ph, err
	}
	ph.byWorker, err = e.filesByWorker(ctx, url)
	return ph, err
}

// warmupPrefix names the warm phases' warm-up files (not measured).
const warmupPrefix = "orders-w-"

// waitArchived waits until n files are archived.
func waitArchived(ctx context.Context, watch *pgx.Conn, n int, procs []*proc) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var done int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM file_intake WHERE state = 'archived'`).Scan(&done); err != nil {
			return err
		}
		if done >= n {
			return nil
		}
		if err := endedEarly(procs, "early"); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d archived within a minute", done, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settleDaemons waits until every daemon is registered and has had time
// to see the others (partner affinity refreshes its view within 2 s) and
// to poll each partner it owns once (its SSH sessions are open).
func (e *env) settleDaemons(ctx context.Context, watch *pgx.Conn, procs []*proc) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM intake_worker WHERE last_seen > now() - lease AND drained_at IS NULL`).Scan(&n); err != nil {
			return err
		}
		if n >= len(procs) {
			break
		}
		for _, p := range procs {
			if p.exited() {
				_, _, _, err := p.wait()
				return fmt.Errorf("a daemon ended before it settled: %v", err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d daemons registered within a minute", n, len(procs))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3200 * time.Millisecond)
	return nil
}

// filesByWorker counts the files each daemon processed.
func (e *env) filesByWorker(ctx context.Context, url string) (map[string]int64, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	rs, err := c.Query(ctx, `SELECT worker_id, count(*) FROM file_intake WHERE remote_name NOT LIKE $1 GROUP BY worker_id`, warmupPrefix+"%")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rs.Next() {
		var w string
		var n int64
		if err := rs.Scan(&w, &n); err != nil {
			return nil, err
		}
		out[w] = n
	}
	return out, rs.Err()
}

// huge measures peak memory on a file HugeRows long.
func (e *fileWorkloads) huge(ctx context.Context, res *Results) error {
	url, root, err := e.databaseAndSite(ctx, "huge")
	if err != nil {
		return err
	}
	cfg, err := e.config("bench-huge", map[string]string{"huge": root}, []string{"huge"})
	if err != nil {
		return err
	}
	size, err := writeCSV(filepath.Join(root, "ready", "orders-huge.csv"), e.o.HugeRows, 0)
	if err != nil {
		return err
	}
	e.say("memory file: %d rows, %.1f MB", e.o.HugeRows, float64(size)/1e6)
	_, res.PeakRSSMiB5M, _, err = e.runOnce(url, cfg)
	if err != nil {
		return err
	}
	n, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err == nil && n != int64(e.o.HugeRows) {
		err = fmt.Errorf("%d rows applied, want %d", n, e.o.HugeRows)
	}
	return err
}

func copyFile(src, dst string) error {
	tmp := dst + ".part"
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// Table prints the figures beside their targets.
func (r *Results) Table(w *os.File) {
	row := func(name string, v float64, unit, target string) {
		fmt.Fprintf(w, "%-38s %12.3f %-8s %s\n", name, v, unit, target)
	}
	if n := max(len(r.LargeRuns), len(r.SmallRuns), len(r.ModesRuns), len(r.PGPRuns), len(r.RejectsRuns)); n > 1 {
		fmt.Fprintf(w, "(medians of %d runs; each run is kept in the JSON)\n", n)
	}
	fmt.Fprintf(w, "%-38s %12s %-8s %s\n", "measure", "value", "unit", "target")
	row("large fresh (intake)", r.LargeFreshS, "s", "")
	row("large fresh (naive)", r.NaiveFreshS, "s", "")
	row("ratio fresh", r.RatioFresh, "x", "<= 0.6")
	row("large replay (intake)", r.LargeReplayS, "s", "")
	row("large replay (naive)", r.NaiveReplayS, "s", "")
	row("ratio replay", r.RatioReplay, "x", "<= 1.0")
	row("floor: psql \\copy into an empty table", r.FloorCopyS, "s", "")
	row("ratio fresh over floor", r.RatioFloor, "x", "<= 1.15")
	row("floor: staged file compared, no writes", r.FloorReplayS, "s", "")
	row("ratio replay over floor", r.RatioFloorReplay, "x", "<= 1.5")
	if r.GuardFreshS > 0 {
		row("large fresh, guarded target (intake)", r.GuardFreshS, "s", "")
		row("guarded fresh over unguarded", r.RatioGuardFresh, "x", "<= 1.05")
		row("large replay, guarded target (intake)", r.GuardReplayS, "s", "")
		row("guarded replay over unguarded", r.RatioGuardReplay, "x", "a few percent")
	}
	row("exact duplicate (intake)", r.DuplicateS, "s", "")
	row("ratio duplicate (vs naive rerun)", r.RatioDuplicate, "x", "<= 0.1")
	row("manifest duplicate (intake, process)", r.ManifestDuplicateS, "s", "")
	row("manifest duplicate (the file, ledger)", r.ManifestDuplicateFileS, "s", "")
	row("dial: login, channels, SFTP start", r.DialMs, "ms", "")
	row("ratio manifest duplicate (vs naive)", r.RatioManifestDuplicate, "x", "<= 0.02")
	row("floor: OpenSSH sftp, manifest read", r.FloorSFTPManifestS, "s", "")
	row("manifest duplicate over that floor", r.RatioManifestDuplicateFloor, "x", "")
	row("small files, one daemon", r.SmallFilesPerS, "files/s", ">= 600")
	row("small files, two daemons", r.TwoReplicasFilesS, "files/s", "")
	row("two over one", r.ScaleTwoOverOne, "x", ">= 0.9, zero double applies")
	row("small files, one daemon, cold", r.SmallFilesPerSCold, "files/s", "")
	row("small files, two daemons, cold", r.TwoReplicasFilesSCold, "files/s", "")
	row("two over one, cold", r.ScaleTwoOverOneCold, "x", "")
	row("double applies", float64(r.DoubleApplies), "", "0")
	if r.WANRTTms > 0 {
		row(fmt.Sprintf("WAN %.0f ms: large fresh (intake)", r.WANRTTms), r.WANLargeS, "s", "")
		row(fmt.Sprintf("WAN %.0f ms: large fresh (naive)", r.WANRTTms), r.WANNaiveLargeS, "s", "")
		row("WAN: intake over naive", r.WANRatioNaive, "x", "")
		row("WAN: dial (login, channels, SFTP start)", r.WANDialMs, "ms", "")
		row("WAN: large, sequential round trips, intake", float64(r.WANLargeTurns), "", "")
		row("WAN: large, sequential round trips, naive", float64(r.WANNaiveLargeTurns), "", "")
		row("WAN: large, the latency proxy's CPU", r.WANLargeProxyCPUS, "s", "")
		row("WAN: large over loopback fresh", r.WANRatioLoopback, "x", "<= 1.3")
		row("WAN: small files, one daemon", r.WANSmallFilesPerS, "files/s", ">= 300")
		row("WAN: sequential round trips per file", r.WANSmallTurnsPerFile, "", "")
		row("WAN: the same, burst only", r.WANSmallBurstTurnsPerFile, "", "")
		for _, k := range []string{"intake", "postgres", "sshd"} {
			if v, ok := r.WANSmallCPUms[k]; ok {
				row("WAN: CPU per small file, "+k, v, "ms", "")
			}
		}
	}
	if r.FleetPartners > 0 {
		row(fmt.Sprintf("fleet: %d partners @every %.0fs, peak RSS", r.FleetPartners, r.FleetPollS), r.FleetRSSMiB, "MiB", "<= 128")
		row("fleet: RSS after the first cycle", r.FleetRSSFirstMiB, "MiB", "")
		row("fleet: goroutines after the first cycle", r.FleetGoroutines, "", "")
		row("fleet: Go heap in use after the first cycle", r.FleetHeapInuseMiB, "MiB", "")
		row("fleet: goroutine stacks after the first cycle", r.FleetStackInuseMiB, "MiB", "")
		row("fleet: exec until every partner polled", r.FleetFirstCycleS, "s", "<= 60")
		row("fleet: exec until the daemon registered", r.FleetStartS, "s", "")
		row("fleet: SSH connections (logins) after the first cycle", float64(r.FleetLogins), "", "")
		row("fleet: sshd CPU per login (first cycle)", r.FleetSSHDCPUmsPerLogin, "ms", "")
		row("fleet: sshd CPU per partner (first cycle)", r.FleetSSHDCPUmsPerPartner, "ms", "")
		for _, k := range []string{"intake", "sshd", "postgres"} {
			if v, ok := r.FleetFirstCycleCPUS[k]; ok {
				row("fleet: CPU in the first cycle, "+k, v, "s", "")
			}
		}
		row("fleet: machine CPU busy in the first cycle", r.FleetFirstCycleBusy*100, "%", "")
		row("fleet: daemon CPU per idle cycle", r.FleetIdleCPUS, "s", "<= 1.0")
		row("fleet: daemon CPU, the first idle cycle", r.FleetIdleFirstCPUS, "s", "")
		row("fleet: sshd CPU per idle cycle", r.FleetIdleSSHDCPUS, "s", "")
		row("fleet: PostgreSQL CPU per idle cycle", r.FleetIdlePGCPUS, "s", "<= 0.2")
		row(fmt.Sprintf("fleet: ready/ to archive p50 (%d files)", r.FleetFiles), r.FleetLatencyP50S, "s", "")
		row("fleet: ready/ to archive p99", r.FleetLatencyP99S, "s", fmt.Sprintf("<= %.0f", r.FleetPollS+3))
		row("fleet: ready/ to archive max", r.FleetLatencyMaxS, "s", "")
		row("fleet: polls failed (partners)", float64(r.FleetPollErrors), "", "0")
	}
	if r.FailoverPartners > 0 {
		leasePoll := r.FailoverLeaseS + r.FailoverPollS
		row(fmt.Sprintf("failover: %d partners, 3 replicas, one killed; its %d partners polled again, p50", r.FailoverPartners, r.FailoverOrphans), r.FailoverOrphanP50S, "s", "")
		row("failover: its partners polled again, p99", r.FailoverOrphanP99S, "s", fmt.Sprintf("<= %.0f (lease + poll interval)", leasePoll))
		row("failover: its partners polled again, max", r.FailoverOrphanMaxS, "s", "")
		row(fmt.Sprintf("failover: ready/ to archive p50 (%d files)", r.FailoverFiles), r.FailoverLatencyP50S, "s", "")
		row("failover: ready/ to archive p99", r.FailoverLatencyP99S, "s", fmt.Sprintf("<= %.0f (lease + poll interval + 5 s)", leasePoll+5))
		row("failover: ready/ to archive max", r.FailoverLatencyMaxS, "s", "")
		row(fmt.Sprintf("failover: its partners' files after the kill (%d), p99", r.FailoverOrphanFiles), r.FailoverOrphanFilesP99S, "s", "")
		row("failover: partners whose survivor's poll failed after the kill", float64(r.FailoverPollErrors), "", "")
		row("failover: rows lost", float64(r.FailoverRowsLost), "", "0")
		row("failover: files taken twice", float64(r.FailoverDuplicated), "", "0")
	}
	if r.ModesRows > 0 {
		row(fmt.Sprintf("snapshot of %d rows, fresh", r.ModesRows-r.ModesRows/10), r.SnapshotFreshS, "s", "")
		row("snapshot deleting a tenth of the rows", r.SnapshotDeleteS, "s", "")
		row("snapshot_delete_ratio (delete/fresh)", r.SnapshotDeleteRatio, "x", "<= 1.2")
		row(fmt.Sprintf("plan, %d rows: exec to awaiting", r.ModesRows), r.PlanS, "s", "")
		row("its apply after intake approve", r.PlanApplyS, "s", "")
		row("plan_ratio (plan over apply)", r.PlanRatio, "x", "<= 0.6")
	}
	if r.PGPBytes > 0 {
		row(fmt.Sprintf("pgp: %.1f MB signed+encrypted", float64(r.PGPBytes)/1e6), r.PGPS, "s", "")
		row("pgp floor: gpg --decrypt | psql \\copy", r.PGPFloorS, "s", "")
		row("pgp: intake over its floor", r.PGPRatioFloor, "x", "<= 1.0")
		row("pgp: peak RSS", r.PGPPeakRSSMiB, "MiB", "<= 64")
	}
	if r.RejectsRows > 0 {
		row(fmt.Sprintf("rejects: %d rows, 10 %% rejected", r.RejectsRows), r.RejectsS, "s", "")
		row("the same file without rejects", r.RejectsCleanS, "s", "")
		row("rejects: with over without", r.RejectsRatio, "x", "<= 1.1")
		row("rejects: peak RSS", r.RejectsPeakRSSMiB, "MiB", "<= 64")
	}
	row("peak RSS, large file", r.PeakRSSMiB1M, "MiB", "<= 64")
	row("peak RSS, large file's replay", r.PeakRSSMiB1MReplay, "MiB", "<= 64")
	row("peak RSS, memory file", r.PeakRSSMiB5M, "MiB", "<= 64")
	row("CPU, one daemon (small files)", r.CPUOneS, "s", "")
	for i, c := range r.CPUTwoS {
		row(fmt.Sprintf("CPU, daemon %d of two", i+1), c, "s", "")
	}
	for _, k := range []string{"intake", "postgres", "sshd"} {
		if v, ok := r.SmallCPUms[k]; ok {
			row("CPU per small file, "+k, v, "ms", "")
		}
	}
	for _, k := range []string{"intake", "postgres", "sshd"} {
		if v, ok := r.SmallCPUmsCold[k]; ok {
			row("CPU per small file, cold, "+k, v, "ms", "")
		}
	}
	for _, k := range []string{"intake", "postgres", "sshd"} {
		if v, ok := r.TwoCPUms[k]; ok {
			row("CPU per small file, two daemons, "+k, v, "ms", "")
		}
	}
}
