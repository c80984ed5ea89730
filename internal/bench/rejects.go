package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// rejects measures a file a tenth of whose rows are rejected (a status
// outside the feed's enum), its rejects report streamed to the partner's
// site, beside the same file with every row valid: each fresh into an
// empty database, `intake run --once` from exec to exit, and the peak RSS
// of the run with rejects.
func (e *featureRuns) rejects(ctx context.Context, res *Results) error {
	n := e.o.RejectsRows
	res.RejectsRows = n
	e.say("rejects: %d rows, %d of them rejected, beside the same file without rejects", n, n/10)
	for _, ph := range []struct {
		name     string
		v        variant
		wall     *float64
		rss      *float64
		rejected int
	}{
		{"orders-clean.csv", variant{}, &res.RejectsCleanS, nil, 0},
		{"orders-rejects.csv", variant{rejectEvery: 10}, &res.RejectsS, &res.RejectsPeakRSSMiB, n / 10},
	} {
		url, root, err := e.databaseAndSite(ctx, "rej")
		if err != nil {
			return err
		}
		cfg, err := e.configFeed("bench-rej", "rej", root, "", "0.2")
		if err != nil {
			return err
		}
		if _, err := writeCSVVariant(filepath.Join(root, "ready", ph.name), n, 0, ph.v); err != nil {
			return err
		}
		if err := e.settle(ctx, url); err != nil {
			return err
		}
		var rss float64
		if *ph.wall, rss, _, err = e.runOnce(url, cfg); err != nil {
			return err
		}
		if ph.rss != nil {
			*ph.rss = rss
		}
		if err := e.outcome(ctx, url, ph.name, n-ph.rejected, ph.rejected); err != nil {
			return err
		}
		if ph.rejected > 0 {
			lines, err := reportLines(filepath.Join(root, "reports"), ph.name)
			if err != nil {
				return err
			}
			if lines != ph.rejected+1 {
				return fmt.Errorf("check failed: the rejects report has %d lines, want %d (a header and a line per rejected row)", lines, ph.rejected+1)
			}
		}
	}
	res.RejectsRatio = res.RejectsS / res.RejectsCleanS
	return nil
}

// reportLines counts the lines of the rejects report of the file name in
// dir (its name begins with the file's and ends in .rejects.csv).
func reportLines(dir, name string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, d := range ents {
		if !strings.HasPrefix(d.Name(), strings.TrimSuffix(name, ".csv")) || !strings.HasSuffix(d.Name(), ".rejects.csv") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, d.Name()))
		if err != nil {
			return 0, err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		lines := 0
		for sc.Scan() {
			lines++
		}
		return lines, sc.Err()
	}
	return 0, fmt.Errorf("no rejects report for %s in %s", name, dir)
}

// outcome checks that the file name is archived with applied rows applied
// and rejected rejected, and says what it is otherwise.
func (e *featureRuns) outcome(ctx context.Context, url, name string, applied, rejected int) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var state string
	var a, r int64
	if err := c.QueryRow(ctx, `SELECT state, coalesce(rows_applied, -1), coalesce(rows_rejected, -1) FROM file_intake WHERE remote_name = $1`, name).Scan(&state, &a, &r); err != nil {
		return fmt.Errorf("check failed: %s in the ledger: %w", name, err)
	}
	if state != "archived" || a != int64(applied) || r != int64(rejected) {
		return fmt.Errorf("check failed: %s is %s with %d rows applied and %d rejected, want archived, %d and %d", name, state, a, r, applied, rejected)
	}
	return nil
}
