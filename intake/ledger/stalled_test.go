package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A takeover ends the stalled sessions of the old worker: those that carry
// its application_name, as intake's own user, in intake's database. A
// session of another user, or in another database, that set the same
// application_name is left alone.
func TestEndStalledEndsOnlyIntakesOwnSessions(t *testing.T) {
	ctx := context.Background()
	url, pool := testenv.DB(t)
	otherURL, _ := testenv.DB(t) // another database on the same server, same user

	var role string
	if err := pool.QueryRow(ctx, `SELECT 'lookalike_' || pg_catalog.current_database()`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE ROLE "`+role+`" LOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP ROLE "`+role+`"`) })

	const worker = "w-stalled"
	// open connects with the worker's application_name and leaves a
	// transaction open.
	open := func(rawURL, user string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			cfg.User = user
		}
		cfg.RuntimeParams["application_name"] = ledger.AppName(worker)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		if _, err := c.Exec(ctx, `BEGIN; SELECT 1`); err != nil {
			t.Fatal(err)
		}
		return c
	}
	own := open(url, "")
	otherUser := open(url, role)
	otherDB := open(otherURL, "")

	// a lease of a microsecond: each transaction above began before it
	if err := ledger.New(pool, time.Microsecond).EndStalled(ctx, worker); err != nil {
		t.Fatal(err)
	}

	alive := func(c *pgx.Conn) bool {
		_, err := c.Exec(ctx, `SELECT 1`)
		return err == nil
	}
	if alive(own) {
		t.Error("the worker's own stalled session, as intake's user in intake's database, is still alive")
	}
	if !alive(otherUser) {
		t.Errorf("a session of role %s that set the worker's application_name was ended", role)
	}
	if !alive(otherDB) {
		t.Error("a session in another database that set the worker's application_name was ended")
	}
}
