package intake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A site whose directories cannot be made ready (archive/ taken by a
// regular file) fails the poll, and the poll only: a file of the partner
// due to be resumed does not run, so no attempt of it is counted for the
// site's failure (the preparation is not waited for by the dial, the
// listings go out behind it: sftpconn.Session.Prepare).
func TestASiteThatCannotBePreparedCountsNoFilesAttempt(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "acme")
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("A", 4))
	cfg := intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1,
		Retry: intake.RetryPolicy{Attempts: 5, Base: time.Millisecond, Max: time.Millisecond}}
	r := newRigCfg(t, pool, cfg, site)
	// the file stops part way, owned by w1 and due again
	if err := fault.Set("apply:mid_chunk=error"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := r.d.PollOnce(ctx, "acme")
	fault.Set("")
	if !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("first poll: %v, want the injected stop", err)
	}
	before := files(t, pool, "acme")
	if len(before) != 1 {
		t.Fatalf("rows: %+v", before)
	}
	attempts := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT attempts FROM file_intake WHERE intake_id = $1`, before[0].ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	was := attempts()
	// archive/ taken by a file: no preparation can make it a directory
	archive := filepath.Join(site.Root, "archive")
	if err := os.RemoveAll(archive); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive, []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.d.Stop()                          // the first process of w1 is gone
	r2 := newRigCfg(t, pool, cfg, site) // a fresh dial, prepared anew
	for i := 0; i < 3; i++ {
		err := r2.d.PollOnce(ctx, "acme")
		if !errors.Is(err, sftpconn.ErrNotPrepared) {
			t.Fatalf("poll %d on a site that cannot be prepared: %v, want sftpconn.ErrNotPrepared", i, err)
		}
		waitDue(t, pool, "acme")
	}
	if n := attempts(); n != was {
		t.Fatalf("the file's attempts went %d -> %d for the site's failure", was, n)
	}
	if after := files(t, pool, "acme"); after[0].State != before[0].State {
		t.Fatalf("the file went %s -> %s on a site that cannot be prepared", before[0].State, after[0].State)
	}
}
