package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ops"
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
