package ops_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/leaderlock"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// A purge holds its lock on a connection of its own: on a 1-connection
// pool it still runs every statement of its partners; and while another
// process holds the purge's lock it does nothing and says so.
func TestAPurgeHoldsItsLockOutsideThePool(t *testing.T) {
	url, _ := testenv.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work := testenv.PoolWith(t, url, func(pc *pgxpool.Config) { pc.MaxConns = 1 })
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	parts := []partners.Config{testenv.NewSite(t, "acme").Validated(t)}
	ret := ops.Retention{PartnerTimeout: 30 * time.Second}
	res, err := ops.Purge(ctx, work, sp, parts, ret, time.Now())
	if err != nil {
		t.Fatalf("purge on a 1-connection pool: %v", err)
	}
	if len(res) != 1 || res[0].Partner != "acme" || res[0].Err != nil {
		t.Fatalf("purged %+v, want acme without error", res)
	}
	other := leaderlock.New(work.Config().ConnConfig, "partner-intake/purge")
	defer other.Close()
	if err := other.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx)
	if _, err := ops.Purge(ctx, work, sp, parts, ret, time.Now()); !errors.Is(err, ops.ErrPurgeRunning) {
		t.Fatalf("purge while another holds its lock: got %v, want ErrPurgeRunning", err)
	}
}

// A report the purge listed as past its retention and that a decision
// wrote again since (a release or discard publishes its receipt under the
// same name) is left for the partner to read: the purge looks at each
// name again right before it removes it. One not written again goes.
func TestAPurgeLeavesAReportWrittenAgainSinceItsListing(t *testing.T) {
	url, _ := testenv.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work := testenv.PoolWith(t, url, nil)
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	site := testenv.NewSite(t, "acme")
	parts := []partners.Config{site.Validated(t)}
	reports := filepath.Join(site.Root, "reports")
	if err := os.MkdirAll(reports, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-200 * 24 * time.Hour)
	for _, name := range []string{"orders-1.csv.receipt.json", "orders-2.csv.receipt.json"} {
		p := filepath.Join(reports, name)
		if err := os.WriteFile(p, []byte(`{"outcome":"quarantined"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := fault.Set("purge:reports_listed=pause"); err != nil {
		t.Fatal(err)
	}
	defer fault.Set("")
	done := make(chan []ops.Purged, 1)
	go func() {
		res, err := ops.Purge(ctx, work, sp, parts, ops.Retention{PartnerTimeout: 30 * time.Second}, time.Now())
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-fault.Paused("purge:reports_listed"):
	case <-ctx.Done():
		t.Fatal("the purge never listed reports/")
	}
	// the decision's receipt, written after the listing
	if err := os.WriteFile(filepath.Join(reports, "orders-1.csv.receipt.json"), []byte(`{"outcome":"discarded"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fault.Resume("purge:reports_listed")
	res := <-done
	if len(res) != 1 || res[0].Err != nil || res[0].Reports != 1 {
		t.Fatalf("purged %+v, want one report removed", res)
	}
	if b, err := os.ReadFile(filepath.Join(reports, "orders-1.csv.receipt.json")); err != nil || !strings.Contains(string(b), "discarded") {
		t.Fatalf("the decision's receipt: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(reports, "orders-2.csv.receipt.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the report past its retention is still there: %v", err)
	}
}
