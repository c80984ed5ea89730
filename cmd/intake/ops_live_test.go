package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

type liveFile struct {
	state, worker, receipt string
}

func liveRow(t *testing.T, pool *pgxpool.Pool, id int64) liveFile {
	t.Helper()
	var f liveFile
	if err := pool.QueryRow(context.Background(), `SELECT state, worker_id, coalesce(receipt_path, '') FROM file_intake WHERE intake_id = $1`, id).
		Scan(&f.state, &f.worker, &f.receipt); err != nil {
		t.Fatal(err)
	}
	return f
}

// holdOf is the token of intake id's current hold, as `intake quarantine
// show` prints it: what a release or discard names.
func holdOf(t *testing.T, pool *pgxpool.Pool, id any) string {
	t.Helper()
	var at time.Time
	if err := pool.QueryRow(context.Background(), `SELECT held_at FROM intake_quarantine WHERE intake_id = $1::text::bigint`, fmt.Sprint(id)).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return ledger.HoldToken(at)
}

// receiptOf reads the partner's receipt of intake id from reports/.
func receiptOf(t *testing.T, site *testenv.Site, id int64) map[string]any {
	t.Helper()
	var found []string
	for _, n := range site.Files(t, "reports") {
		if strings.HasSuffix(n, "."+strconv.FormatInt(id, 10)+".receipt.json") {
			found = append(found, n)
		}
	}
	if len(found) != 1 {
		t.Fatalf("receipts of intake %d: %v", id, found)
	}
	var rc map[string]any
	if err := json.Unmarshal([]byte(site.Read(t, filepath.Join("reports", found[0]))), &rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// Ops commands run beside a live daemon of the same configuration (same
// worker id): release with either winner, release of a rejected-rows hold,
// discard and replay all exit 0, the daemon never adopts the replay's row,
// every decision ends in a receipt that says what happened, no reason file
// of a decided file is left, and the reconciler finds nothing for a human.
func TestOpsCommandsBesideARunningDaemon(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "live")
	spoolDir := t.TempDir()
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "live-1", poll: "@every 1s", schedule: "@every 1s", spool: spoolDir})
	must := func(code int, out string) string {
		t.Helper()
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		return out
	}
	rejects := testenv.OrdersHeader + "R-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1\nR-2,x,1.00,paid,2026-11-01T00:00:00Z,1\nR-3,y,1.00,paid,2026-11-01T00:00:00Z,1\n"
	site.Drop(t, "orders-r.csv", rejects)
	site.Drop(t, "orders-x.csv", strings.ReplaceAll(rejects, "R-", "X-"))
	site.Drop(t, "orders-c.csv", testenv.OrdersCSV("C", 3))
	site.Drop(t, "orders-d.csv", testenv.OrdersCSV("D", 3))
	must(runCLI("run", "--config", cfg, "--once"))
	site.Drop(t, "orders-c.csv", strings.ReplaceAll(testenv.OrdersCSV("C", 3), "paid", "shipped"))
	site.Drop(t, "orders-d.csv", strings.ReplaceAll(testenv.OrdersCSV("D", 3), "paid", "shipped"))
	must(runCLI("run", "--config", cfg, "--once"))
	ids := map[string]int64{}
	for _, f := range testenv.Files(t, pool, "live") {
		ids[f.Name+"/"+f.State] = f.ID
	}
	rej, disc, newWins, oldWins, orig := ids["orders-r.csv/quarantined"], ids["orders-x.csv/quarantined"],
		ids["orders-c.csv/quarantined"], ids["orders-d.csv/quarantined"], ids["orders-c.csv/archived"]
	if rej == 0 || disc == 0 || newWins == 0 || oldWins == 0 || orig == 0 {
		t.Fatalf("files: %v", ids)
	}
	if n := len(site.Files(t, "quarantine")); n != 8 {
		t.Fatalf("quarantine/ holds %d files, want 4 held files and 4 reason files", n)
	}

	daemon := startIntake(t, url, "", "run", "--config", cfg)
	id := func(n int64) string { return strconv.FormatInt(n, 10) }
	state := func(id int64, want string) func() bool {
		return func() bool { return liveRow(t, pool, id).state == want }
	}

	// replay while the daemon polls: held before its receipt until the
	// daemon has polled the partner since, then let go
	if err := fault.Set("publish:receipt=pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	type result struct {
		code int
		out  string
	}
	replayed := make(chan result, 1)
	go func() {
		code, out := runCLI("replay", id(orig), "--config", cfg, "--reason", "check", "--actor", "dave")
		replayed <- result{code, out}
	}()
	select {
	case <-fault.Paused("publish:receipt"):
	case r := <-replayed:
		t.Fatalf("the replay ended before its receipt: %d %s", r.code, r.out)
	case <-time.After(time.Minute):
		t.Fatal("the replay never reached its receipt")
	}
	var paused time.Time
	pool.QueryRow(context.Background(), `SELECT now()`).Scan(&paused)
	waitFor(t, time.Minute, func() bool {
		var ok bool
		pool.QueryRow(context.Background(), `SELECT coalesce(max(last_ok_at) > $1::timestamptz + interval '2 seconds', false)
			FROM intake_partner_poll WHERE partner_id = 'live' AND worker_id = 'live-1'`, paused).Scan(&ok)
		return ok
	}, daemon)
	var rid int64
	var rworker string
	pool.QueryRow(context.Background(), `SELECT intake_id, worker_id FROM file_intake WHERE replay_of = $1`, orig).Scan(&rid, &rworker)
	if rworker == "live-1" || !strings.HasPrefix(rworker, "live-1/ops-") {
		t.Fatalf("the replay's row is held by %q, want the ops identity", rworker)
	}
	fault.Resume("publish:receipt")
	r := <-replayed
	if r.code != 0 || !strings.Contains(r.out, "archived, rows 0 applied, 3 unchanged") {
		t.Fatalf("replay beside the daemon: exit %d\n%s\n%s", r.code, r.out, tail(daemon.output()))
	}
	if rc := receiptOf(t, site, rid); rc["outcome"] != "accepted" || rc["intake_id"] != float64(rid) {
		t.Fatalf("replay receipt %v", rc)
	}
	fault.Set("")

	// decisions beside the daemon
	must(runCLI("quarantine", "release", id(newWins), "--hold", holdOf(t, pool, newWins), "--config", cfg, "--reason", "the resend is the correction", "--actor", "bob", "--winner", "new"))
	if out := must(runCLI("quarantine", "release", id(oldWins), "--hold", holdOf(t, pool, oldWins), "--config", cfg, "--reason", "the first one stands", "--actor", "bob", "--winner", "old")); !strings.Contains(out, "intake "+id(oldWins)+" discarded by bob: the earlier bytes of its batch stand") || strings.Contains(out, "released") {
		t.Fatalf("a release with the earlier bytes winning says:\n%s", out)
	}
	must(runCLI("quarantine", "release", id(rej), "--hold", holdOf(t, pool, rej), "--config", cfg, "--reason", "partner confirmed", "--actor", "alice"))
	must(runCLI("quarantine", "discard", id(disc), "--hold", holdOf(t, pool, disc), "--config", cfg, "--reason", "not wanted", "--actor", "carol"))
	waitFor(t, time.Minute, func() bool { return state(newWins, "archived")() && state(rej, "archived")() }, daemon)

	want := map[int64]string{newWins: "accepted", rej: "accepted_with_rejects", oldWins: "discarded", disc: "discarded"}
	for iid, outcome := range want {
		f := liveRow(t, pool, iid)
		rc := receiptOf(t, site, iid)
		if rc["outcome"] != outcome || f.receipt == "" || !strings.HasSuffix(f.receipt, "."+id(iid)+".receipt.json") {
			t.Fatalf("intake %d (%s): receipt %v, want outcome %s", iid, f.state, rc, outcome)
		}
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'live' AND order_id LIKE 'C-%' AND status = 'shipped'`); n != 3 {
		t.Fatalf("%d C rows carry the winning bytes, want 3", n)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'live' AND order_id LIKE 'D-%' AND status = 'paid'`); n != 3 {
		t.Fatalf("%d D rows keep the first bytes, want 3", n)
	}
	held := site.Files(t, "quarantine")
	if len(held) != 2 {
		t.Fatalf("quarantine/ holds %v, want only the two discarded files (no reason file)", held)
	}
	for _, h := range held {
		if strings.HasSuffix(h, ".reason.json") {
			t.Fatalf("a reason file of a decided file is left: %s", h)
		}
	}
	rec := startIntake(t, url, "", "reconcile", "--config", cfg)
	if ws := rec.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("reconcile found something for a human (%v):\n%s", ws, rec.output())
	}
	daemon.signal(syscall.SIGTERM)
	if ws := daemon.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("the daemon exited %v:\n%s", ws, tail(daemon.output()))
	}
}
