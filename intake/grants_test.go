package intake_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
)

// The daemon's grants of grants.sql (and its target table's, as `intake
// grants --config` prints them for a snapshot feed) carry the pipeline's
// other paths through, as the daemon's role on real PostgreSQL: small
// files in a group (a rejected row, an exact resend), a snapshot that
// waits for approval and then deletes the rows it lacks, and the
// reconciler taking a released file over.
func TestTheDaemonsGrantsCarryGroupsSnapshotsAndTheReconciler(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	var db string
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	daemon, opsRole, purge := "dd_"+db, "do_"+db, "dp_"+db
	exec(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN; CREATE ROLE %s NOLOGIN; CREATE ROLE %s NOLOGIN`, daemon, opsRole, purge))
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s, %[2]s, %[3]s; DROP ROLE %[1]s, %[2]s, %[3]s`, daemon, opsRole, purge))
	})
	sql, err := ledger.Grants(ledger.GrantRoles{Database: db, Schema: migrations.Schema, Daemon: daemon, Ops: opsRole, Purge: purge})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, admin, sql+`GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO `+daemon)
	pc, err := intake.PoolConfig(strings.Replace(url, "//postgres@", "//"+daemon+"@", 1), "w1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)

	// small files in a group
	grp := testenv.NewSite(t, "ggrp")
	snap := testenv.NewSite(t, "gsnap")
	snap.Config.Feeds[0].Mode = partners.ModeSnapshot
	r := newRig(t, pool, "w1", grp, snap)
	grp.Drop(t, "orders-b1.csv", goodRows("B1", 4))
	r.poll("ggrp")
	grp.Drop(t, "orders-g1.csv", goodRows("G1", 4))
	grp.Drop(t, "orders-g2.csv", goodRows("G2", 4))
	grp.Drop(t, "orders-rej.csv", header+
		"R-1,a@example.com,10.00,paid,2026-11-01T10:00:00Z,1\n"+
		"R-2,a@example.com,not-a-number,paid,2026-11-01T10:00:00Z,1\n")
	grp.Drop(t, "orders-b1.csv", goodRows("B1", 4)) // the exact bytes again
	r.poll("ggrp")
	if n := grouped(r, "ggrp", "grouped"); n != 4 {
		t.Errorf("%v files went through a group, want 4", n)
	}
	got := map[string]string{}
	for _, f := range files(t, admin, "ggrp") {
		got[f.Name] += fmt.Sprintf("%s/%d ", f.State, f.Applied)
	}
	if w := "archived/4 duplicate/0 "; got["orders-b1.csv"] != w || got["orders-g1.csv"] != "archived/4 " || got["orders-g2.csv"] != "archived/4 " || got["orders-rej.csv"] != "archived/1 " {
		t.Errorf("group files %v, want b1 archived then a duplicate, g1 and g2 archived with 4 rows, rej with 1", got)
	}

	// a snapshot: the second deletes what it lacks, once approved
	snap.Drop(t, "orders-1.csv", goodRows("S", 6))
	r.poll("gsnap")
	snap.Drop(t, "orders-2.csv", goodRows("S", 2))
	r.poll("gsnap")
	fs := files(t, admin, "gsnap")
	if len(fs) != 2 || fs[0].State != "archived" || fs[1].State != "awaiting_approval" {
		t.Fatalf("snapshot files %+v, want the first archived, the second awaiting approval", fs)
	}
	v, _ := planOf(t, admin, "gsnap", fs[1].ID)
	if err := approve(ctx, admin, "gsnap", fs[1].ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	r.poll("gsnap")
	if f := files(t, admin, "gsnap")[1]; f.State != "archived" {
		t.Errorf("the approved snapshot %+v, want archived", f)
	}
	if n := count(t, admin, `SELECT count(*) FROM orders WHERE partner_id = 'gsnap'`); n != 2 {
		t.Errorf("the target holds %d rows of the snapshot feed, want 2", n)
	}

	// a batch conflict is held; released (by ops, as the tables' owner
	// here), the reconciler takes it over as the daemon's role and the
	// next poll applies it
	grp.Drop(t, "orders-b1.csv", goodRows("N1", 3))
	r.poll("ggrp")
	fs = files(t, admin, "ggrp")
	held := fs[len(fs)-1]
	if held.State != "quarantined" {
		t.Fatalf("the conflicting resend %+v, want it held", held)
	}
	if err := ops.Release(ctx, admin, ops.Decision{IntakeID: held.ID, Actor: "bob", Reason: "the resend is right",
		Winner: ops.WinnerNew, Partners: []string{"ggrp"}, Worker: intake.OpsWorker("ops")}); err != nil {
		t.Fatal(err)
	}
	r.reconcileOnce(grp, snap)
	r.poll("ggrp")
	if f := files(t, admin, "ggrp")[len(fs)-1]; f.State != "archived" || f.Applied != 3 {
		t.Errorf("the released file %+v, want archived with 3 rows", f)
	}
}
