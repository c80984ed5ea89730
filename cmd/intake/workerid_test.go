package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// `intake run --once` whose worker id another live process holds (the
// daemon of its host: worker_id defaults to the hostname; an earlier
// one-shot run still going) polls nothing and exits 1 naming the holder;
// once the id is free it runs.
func TestRunOnceBesideAProcessOfItsWorkerIDPollsNothing(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "wonce")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("W", 3))
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := ledger.TryWorkerLock(context.Background(), cc, "cli-1", time.Minute, ledger.WorkerLockHooks{})
	if err != nil {
		t.Fatal(err)
	}
	code, out := runCLI("run", "--config", cfg, "--once")
	if code != 1 || !strings.Contains(out, "worker id cli-1 is in use by another live process (PostgreSQL backend ") || !strings.Contains(out, "worker_id_in_use") {
		t.Fatalf("run --once beside the holder: exit %d\n%s", code, out)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake`); n != 0 {
		t.Fatalf("%d files claimed by a run whose worker id another process held", n)
	}
	holder.Release()
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once with its worker id free: exit %d\n%s", code, out)
	}
	if fs := testenv.Files(t, pool, "wonce"); len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("files %+v, want the file archived", fs)
	}
}
