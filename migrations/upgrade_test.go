package migrations_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/migrations"
)

// A role that may write file_intake.receipt_path by the column list of
// an earlier `intake grants` (the ops role: a discard writes it) may
// write receipt_pending once the migration that adds it ran: a
// column-list grant does not reach a column added after it, and a
// discard writes both. Without the migration's grant, an upgraded
// install's ops role is refused every discard until `intake grants` is
// applied again.
func TestAnUpgradeGrantsReceiptPendingToWhoMayWriteReceiptPath(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	role := fmt.Sprintf("upgrade_ops_%d", os.Getpid())
	for _, q := range []string{
		`CREATE ROLE ` + role,
		`GRANT UPDATE (receipt_path) ON intake.file_intake TO ` + role,
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
	if err := migrations.Steps(url, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(url); err != nil {
		t.Fatal(err)
	}
	var may, other bool
	if err := admin.QueryRow(ctx, `SELECT pg_catalog.has_column_privilege($1, 'intake.file_intake', 'receipt_pending', 'UPDATE'),
		    pg_catalog.has_column_privilege($1, 'intake.file_intake', 'state', 'UPDATE')`, role).Scan(&may, &other); err != nil {
		t.Fatal(err)
	}
	if !may || other {
		t.Fatalf("%s may update receipt_pending: %v, state: %v; want receipt_pending alone", role, may, other)
	}
}
