package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
)

// featureRuns measures features beside their targets: the import modes
// (a snapshot's deletes, a plan approved through the CLI), PGP and a
// large reject set.
type featureRuns struct{ *env }

// modes measures the import modes that plan against the target: a
// snapshot that deletes a tenth of the partner's rows over a fresh load
// of a file of its size, and a plan for approval over the apply that
// follows the approval.
func (e *featureRuns) modes(ctx context.Context, res *Results) error {
	n := e.o.ModesRows
	res.ModesRows = n
	if err := e.snapshotDelete(ctx, n, res); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := e.planApproval(ctx, n, res); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

// snapshotFeed is a snapshot feed whose delete guard lets a tenth of the
// partner's rows go without approval (the default max_share is 0.1).
const snapshotFeed = "        mode: snapshot\n        delete_guard: {max_share: 0.2}\n"

// snapshotDelete: the file of 0.9 n rows fresh into an empty database (the
// denominator); then, in another database, n rows fresh and a snapshot of
// 0.9 n of those keys, which deletes the other 0.1 n.
func (e *featureRuns) snapshotDelete(ctx context.Context, n int, res *Results) error {
	keep := n - n/10
	src := filepath.Join(e.dir, "snapshot.csv")
	if _, err := writeCSV(src, keep, 0); err != nil {
		return err
	}
	defer os.Remove(src)
	e.say("modes: snapshot of %d rows, fresh and over %d rows (deleting %d)", keep, n, n-keep)

	// the same-size file fresh
	url, root, err := e.databaseAndSite(ctx, "snap")
	if err != nil {
		return err
	}
	cfg, err := e.configFeed("bench-snap", "snap", root, snapshotFeed, "")
	if err != nil {
		return err
	}
	if err := copyFile(src, filepath.Join(root, "ready", "orders-snap-fresh.csv")); err != nil {
		return err
	}
	if res.SnapshotFreshS, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	if got, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`); err != nil || got != int64(keep) {
		return fmt.Errorf("fresh snapshot: %d rows (want %d), %v", got, keep, err)
	}

	// n rows, then the snapshot of 0.9 n of them
	if url, root, err = e.databaseAndSite(ctx, "snap"); err != nil {
		return err
	}
	if cfg, err = e.configFeed("bench-snap", "snap", root, snapshotFeed, ""); err != nil {
		return err
	}
	if _, err := writeCSV(filepath.Join(root, "ready", "orders-snap-all.csv"), n, 0); err != nil {
		return err
	}
	if _, _, _, err = e.runOnce(url, cfg); err != nil {
		return err
	}
	if err := copyFile(src, filepath.Join(root, "ready", "orders-snap-keep.csv")); err != nil {
		return err
	}
	if res.SnapshotDeleteS, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	ok, err := e.count(ctx, url, `SELECT count(*) FROM file_intake WHERE state = 'archived' AND
		((remote_name = 'orders-snap-all.csv' AND rows_applied = $1) OR (remote_name = 'orders-snap-keep.csv' AND rows_unchanged = $2 AND rows_deleted = $3))`, n, keep, n-keep)
	if err != nil {
		return err
	}
	left, err := e.count(ctx, url, `SELECT count(*) FROM bench_orders`)
	if err != nil {
		return err
	}
	if ok != 2 || left != int64(keep) {
		return fmt.Errorf("check failed: %d file outcomes as expected (want 2), %d rows left (want %d)", ok, left, keep)
	}
	res.SnapshotDeleteRatio = res.SnapshotDeleteS / res.SnapshotFreshS
	return nil
}

// planHash reads the plan hash `intake plan show` prints.
var planHash = regexp.MustCompile(`plan hash\s+([0-9a-f]{64})`)

// planApproval: n rows loaded, then a file of the same keys, every row
// changed, into the feed with `approval: {always: true}`: `intake run
// --once` from its exec until the file waits in awaiting_approval (the
// plan), then `intake approve` with the hash `intake plan show` prints,
// and the `intake run --once` that applies it (its poll, the two plans
// before the apply, and the apply).
func (e *featureRuns) planApproval(ctx context.Context, n int, res *Results) error {
	e.say("modes: plan of %d changed rows against %d loaded, and its apply after approval", n, n)
	url, root, err := e.databaseAndSite(ctx, "plan")
	if err != nil {
		return err
	}
	load, err := e.configFeed("bench-plan", "plan", root, "", "")
	if err != nil {
		return err
	}
	// the policy is not part of the mapping: the same feed, planned
	cfg, err := e.configFeed("bench-plan", "plan", root, "        approval: {always: true}\n", "")
	if err != nil {
		return err
	}
	if _, err := writeCSV(filepath.Join(root, "ready", "orders-plan-load.csv"), n, 0); err != nil {
		return err
	}
	if _, _, _, err = e.runOnce(url, load); err != nil {
		return err
	}
	if _, err := writeCSVVariant(filepath.Join(root, "ready", "orders-plan.csv"), n, 0, variant{bump: 1}); err != nil {
		return err
	}
	if res.PlanS, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	id, err := e.count(ctx, url, `SELECT intake_id FROM file_intake WHERE remote_name = 'orders-plan.csv' AND state = 'awaiting_approval'`)
	if err != nil {
		return fmt.Errorf("the file does not await approval: %w", err)
	}
	show, err := e.cli(url, "plan", "show", strconv.FormatInt(id, 10), "--config", cfg)
	if err != nil {
		return err
	}
	m := planHash.FindStringSubmatch(show)
	if m == nil || !regexp.MustCompile(fmt.Sprintf(`updates\s+%d\b`, n)).MatchString(show) {
		return fmt.Errorf("intake plan show does not show a plan hash and %d updates:\n%s", n, show)
	}
	if _, err := e.cli(url, "approve", strconv.FormatInt(id, 10), "--config", cfg, "--plan-hash", m[1], "--reason", "bench", "--actor", "bench"); err != nil {
		return err
	}
	if res.PlanApplyS, _, _, err = e.settledRun(ctx, url, cfg); err != nil {
		return err
	}
	ok, err := e.count(ctx, url, `SELECT count(*) FROM file_intake WHERE remote_name IN ('orders-plan-load.csv', 'orders-plan.csv') AND state = 'archived' AND rows_applied = $1`, n)
	if err != nil {
		return err
	}
	if ok != 2 {
		return fmt.Errorf("check failed: the loaded and the approved file are not both archived with %d rows applied", n)
	}
	res.PlanRatio = res.PlanS / res.PlanApplyS
	return nil
}

// cli runs an intake command against url and returns its output.
func (e *featureRuns) cli(url string, args ...string) (string, error) {
	cmd := exec.Command(e.o.IntakeBinary, args...)
	cmd.Env = append(os.Environ(), "INTAKE_DATABASE_URL="+url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("intake %v: %v\n%s", args, err, out)
	}
	return string(out), nil
}
