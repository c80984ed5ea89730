package migrations_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

// A role that may write a column of file_intake by the column list of an
// earlier `intake grants` may write the column a later migration adds
// for the same decision: a column-list grant does not reach a column
// added after it. receipt_pending (025) goes with receipt_path (a
// discard writes both), rows_applied_earlier (026) with rows_applied (a
// release writes both). Without the migration's grant, an upgraded
// install's ops role is refused every such decision until `intake
// grants` is applied again.
func TestAnUpgradeGrantsANewColumnToWhoMayWriteItsFellow(t *testing.T) {
	for _, c := range []struct {
		migration  uint
		had, added string
	}{
		{25, "receipt_path", "receipt_pending"},
		{26, "rows_applied", "rows_applied_earlier"},
	} {
		t.Run(c.added, func(t *testing.T) {
			url, admin := testenv.DB(t)
			ctx := context.Background()
			role := fmt.Sprintf("upgrade_ops_%d_%d", os.Getpid(), c.migration)
			for _, q := range []string{
				`CREATE ROLE ` + role,
				`GRANT UPDATE (` + c.had + `) ON intake.file_intake TO ` + role,
			} {
				if _, err := admin.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				admin.Exec(ctx, `REVOKE ALL ON intake.file_intake FROM `+role)
				admin.Exec(ctx, `DROP ROLE `+role)
			})
			// the install before the column, then the upgrade
			latest, err := migrations.Latest()
			if err != nil {
				t.Fatal(err)
			}
			if err := migrations.Steps(url, -int(latest-c.migration+1)); err != nil {
				t.Fatal(err)
			}
			var there bool
			if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
				WHERE attrelid = 'intake.file_intake'::regclass AND attname = $1 AND NOT attisdropped)`, c.added).Scan(&there); err != nil || there {
				t.Fatalf("%s still there (%v) before migration %d", c.added, err, c.migration)
			}
			if _, err := migrations.Up(url); err != nil {
				t.Fatal(err)
			}
			var may, other bool
			if err := admin.QueryRow(ctx, `SELECT pg_catalog.has_column_privilege($1, 'intake.file_intake', $2, 'UPDATE'),
				    pg_catalog.has_column_privilege($1, 'intake.file_intake', 'state', 'UPDATE')`, role, c.added).Scan(&may, &other); err != nil {
				t.Fatal(err)
			}
			if !may || other {
				t.Fatalf("%s may update %s: %v, state: %v; want %s alone", role, c.added, may, other, c.added)
			}
		})
	}
}

// The roles an earlier `intake grants` set up get their rights on
// intake_claim_id (027) with the upgrade: without them an upgraded
// install's daemon is refused every claim (it keeps each claim's id
// there before the RENAME) until `intake grants` is applied again. The
// daemon's role (INSERT on file_intake) keeps and drops ids, the purge
// role (EXECUTE on intake_purge_audit) deletes them, and the ops role
// (INSERT on some of file_intake's columns, for a replay) gets nothing.
// Each role is granted as grants.sql grants it.
func TestAnUpgradeGrantsTheClaimIDsToTheRolesOfEarlierGrants(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.Steps(url, -int(latest-27+1)); err != nil {
		t.Fatal(err)
	}
	pre := fmt.Sprintf("upgrade_%d_", os.Getpid())
	roles := map[string]string{
		"daemon": `GRANT INSERT ON intake.file_intake TO %s`,
		"purge":  `GRANT EXECUTE ON FUNCTION intake.intake_purge_audit(text, timestamptz) TO %s`,
		"ops": `GRANT SELECT ON intake.intake_record_claim TO %[1]s;
			GRANT INSERT (intake_id, partner_id, feed, remote_name, claimed_path, state) ON intake.file_intake TO %[1]s`,
	}
	for name, grant := range roles {
		role := pre + name
		for _, q := range []string{`CREATE ROLE ` + role, fmt.Sprintf(grant, role)} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			admin.Exec(ctx, `DROP OWNED BY `+role)
			admin.Exec(ctx, `DROP ROLE `+role)
		})
	}
	if _, err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"daemon": "SIUD", "purge": "S..D", "ops": "...."} {
		got := ""
		for i, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
			var may bool
			if err := admin.QueryRow(ctx, `SELECT pg_catalog.has_table_privilege($1, 'intake.intake_claim_id', $2)`, pre+name, priv).Scan(&may); err != nil {
				t.Fatal(err)
			}
			if may {
				got += "SIUD"[i : i+1]
			} else {
				got += "."
			}
		}
		if got != want {
			t.Fatalf("the %s role's rights on intake_claim_id: %s, want %s (SELECT, INSERT, UPDATE, DELETE)", name, got, want)
		}
	}
}
