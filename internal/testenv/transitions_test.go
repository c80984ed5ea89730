package testenv_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The test database's guard refuses a change of state the transition
// table does not list when intake's own connection makes it, lets a listed
// one through, and leaves a test's own connection alone.
func TestTheTransitionGuardRefusesWhatTheTableDoesNotList(t *testing.T) {
	ctx := context.Background()
	url, pool := testenv.DB(t)
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('g', 'orders', 'a.csv', '/p/w/a.csv', 1, 'archived', 'w', now()) RETURNING intake_id`).Scan(&id); err != nil {
		t.Fatalf("a test's own insert was refused: %v", err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = ledger.AppName("w-guard")
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `UPDATE file_intake SET state = 'applying' WHERE intake_id = $1`, id)
	if err == nil || !strings.Contains(err.Error(), `from state "archived" to "applying"`) {
		t.Fatalf("archived -> applying by intake's connection: %v, want it refused", err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('g', 'orders', 'b.csv', '/p/w/b.csv', 1, 'applied', 'w', now())`); err == nil {
		t.Fatal("a row first recorded as applied by intake's connection was let through")
	}
	if _, err := c.Exec(ctx, `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
		VALUES ('g', 'orders', 'c.csv', '/p/w/c.csv', 1, 'claimed', 'w', now())`); err != nil {
		t.Fatalf("a claim was refused: %v", err)
	}
	if _, err := c.Exec(ctx, `UPDATE file_intake SET state = 'spooled' WHERE remote_name = 'c.csv'`); err != nil {
		t.Fatalf("claimed -> spooled was refused: %v", err)
	}
}
