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
