package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The approval commands end to end with the real binary's code paths: a
// file of a feed with `approval: {always: true}` waits (status says so and
// exits 1), `plan show` prints its counts, hash and a sample with values
// (the daemon's log carries none of them), `approve` with a wrong hash is
// refused naming the current one, with the right hash the next run applies
// it; `reject` quarantines the next file with plan_rejected, and the
// partner's receipt says so; `audit` lists both decisions.
func TestPlanApproveRejectCommands(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "apr")
	cfg := writeConfigOpts(t, site, cfgOpts{feedExtra: "        approval: {always: true}\n"})
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("P", 3))
	code, runOut := runCLI("run", "--config", cfg, "--once")
	if code != 0 {
		t.Fatalf("run: %d\n%s", code, runOut)
	}
	fs := testenv.Files(t, pool, "apr")
	if len(fs) != 1 || fs[0].State != "awaiting_approval" {
		t.Fatalf("files %+v", fs)
	}
	id := strconv.FormatInt(fs[0].ID, 10)
	if !strings.Contains(runOut, "plan awaits approval") {
		t.Fatalf("the daemon did not log the wait:\n%s", runOut)
	}
	for _, v := range []string{"P-1", "10.01", "c1@example.com"} {
		if strings.Contains(runOut, v) {
			t.Fatalf("the daemon's output carries the value %q:\n%s", v, runOut)
		}
	}
	code, out := runCLI("status", "--config", cfg)
	if code != 1 || !strings.Contains(out, "ATTN awaiting approval: 1 file(s)") || !strings.Contains(out, "intake plan show "+id) {
		t.Fatalf("status %d:\n%s", code, out)
	}
	code, out = runCLI("plan", "show", id, "--config", cfg)
	if code != 0 {
		t.Fatalf("plan show %d:\n%s", code, out)
	}
	hash := regexp.MustCompile(`plan hash\s+([0-9a-f]{64})`).FindStringSubmatch(out)
	if hash == nil || !regexp.MustCompile(`creates\s+3`).MatchString(out) || !strings.Contains(out, `(P-1)`) || !strings.Contains(out, "create") {
		t.Fatalf("plan show:\n%s", out)
	}
	for _, refused := range []struct {
		name string
		args []string
		code int
		says []string
	}{
		{"without a hash", []string{"--reason", "ok"}, 2, []string{"--plan-hash"}},
		{"with a wrong hash", []string{"--plan-hash", strings.Repeat("a", 64), "--reason", "ok", "--actor", "erin"}, exitRefused, []string{"refused", hash[1]}},
	} {
		code, out := runCLI(append([]string{"approve", id, "--config", cfg}, refused.args...)...)
		if code != refused.code {
			t.Fatalf("approve %s: exit %d, want %d\n%s", refused.name, code, refused.code, out)
		}
		for _, w := range refused.says {
			if !strings.Contains(out, w) {
				t.Fatalf("approve %s does not say %q:\n%s", refused.name, w, out)
			}
		}
	}
	code, out = runCLI("approve", id, "--config", cfg, "--plan-hash", hash[1], "--reason", "reviewed", "--actor", "erin")
	if code != 0 {
		t.Fatalf("approve: %d\n%s", code, out)
	}
	if w := "acting as database user \"postgres\", actor \"erin\"\n"; !strings.Contains(out, w) {
		t.Errorf("approve said:\n%s\nwant it to say %q", out, w)
	}
	if got := testenv.Strings(t, pool, `SELECT actor || ' ' || db_user FROM intake_audit WHERE action = 'approve'`); len(got) != 1 || got[0] != "erin postgres" {
		t.Errorf("approve audited as %v, want actor erin, db user postgres", got)
	}
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d\n%s", code, out)
	}
	if f := testenv.Files(t, pool, "apr")[0]; f.State != "archived" || f.Applied != 3 {
		t.Fatalf("approved file %+v", f)
	}

	site.Drop(t, "orders-2.csv", testenv.OrdersCSV("Q", 2))
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d\n%s", code, out)
	}
	f2 := testenv.Files(t, pool, "apr")[1]
	id2 := strconv.FormatInt(f2.ID, 10)
	code, out = runCLI("reject", id2, "--config", cfg, "--reason", "wrong price list", "--actor", "erin\x1b[2J")
	if code != 0 {
		t.Fatalf("reject: %d\n%s", code, out)
	}
	if strings.Contains(out, "\x1b") || !strings.Contains(out, `rejected by erin\x1b[2J`) {
		t.Fatalf("reject printed the actor unescaped:\n%q", out)
	}
	if code, out := runCLI("reject", id2, "--config", cfg, "--reason", "again"); code != exitRefused || !strings.Contains(out, "not awaiting approval") {
		t.Fatalf("second reject: %d\n%s", code, out)
	}
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d\n%s", code, out)
	}
	if f := testenv.Files(t, pool, "apr")[1]; f.State != "quarantined" || f.Reason != "plan_rejected" {
		t.Fatalf("rejected file %+v", f)
	}
	if rc := receiptOf(t, site, f2.ID); rc["outcome"] != "quarantined" || rc["reason"] != "plan_rejected" {
		t.Fatalf("receipt %v", rc)
	}
	code, out = runCLI("audit", "--config", cfg)
	if code != 0 || !strings.Contains(out, "approve") || !strings.Contains(out, "reject") || !strings.Contains(out, "wrong price list") {
		t.Fatalf("audit %d:\n%s", code, out)
	}
}

// `plan show` reads a waiting plan's changes from intake_plan_change, as
// the console does, a page at a time: more than one page of them (25
// creates, a page of 20 by default) ends with the next page's command,
// which shows the rest; --limit shows them all at once, and --key filters.
func TestPlanShowPagesTheStoredChanges(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "apg")
	cfg := writeConfigOpts(t, site, cfgOpts{feedExtra: "        approval: {always: true}\n"})
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("P", 25))
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run: %d\n%s", code, out)
	}
	fs := testenv.Files(t, pool, "apg")
	if len(fs) != 1 || fs[0].State != "awaiting_approval" {
		t.Fatalf("files %+v", fs)
	}
	id := strconv.FormatInt(fs[0].ID, 10)
	shown := func(out string) []string {
		return regexp.MustCompile(`(?m)^\d+\s+\d+\s+create\s+\((P-\d+)\)`).FindAllString(out, -1)
	}
	code, out := runCLI("plan", "show", id, "--config", cfg)
	next := regexp.MustCompile(`next page: intake plan show \d+ --config \S+ --after (\d+) --plan-hash (\S+)`).FindStringSubmatch(out)
	if code != 0 || len(shown(out)) != 20 || !strings.Contains(out, "(P-20)") || strings.Contains(out, "(P-21)") || next == nil {
		t.Fatalf("plan show %d, want the first 20 changes and the next page's command:\n%s", code, out)
	}
	if code, out := runCLI("plan", "show", id, "--config", cfg, "--after", next[1], "--plan-hash", "not-"+next[2]); code != exitRefused ||
		!strings.Contains(out, "planned again since the page before") || strings.Contains(out, "(P-21)") {
		t.Fatalf("the next page of another plan: %d, want it refused (3):\n%s", code, out)
	}
	code, out = runCLI("plan", "show", id, "--config", cfg, "--after", next[1], "--plan-hash", next[2])
	if code != 0 || len(shown(out)) != 5 || !strings.Contains(out, "(P-21)") || !strings.Contains(out, "(P-25)") || strings.Contains(out, "(P-20)") || strings.Contains(out, "next page") {
		t.Fatalf("plan show --after %s: %d, want the last 5 changes:\n%s", next[1], code, out)
	}
	code, out = runCLI("plan", "show", id, "--config", cfg, "--limit", "100")
	if code != 0 || len(shown(out)) != 25 || strings.Contains(out, "next page") {
		t.Fatalf("plan show --limit 100: %d, want all 25 changes:\n%s", code, out)
	}
	code, out = runCLI("plan", "show", id, "--config", cfg, "--key", "(P-2")
	if code != 0 || len(shown(out)) != 7 || !strings.Contains(out, "(P-2)") || !strings.Contains(out, "(P-25)") || strings.Contains(out, "(P-3)") {
		t.Fatalf("plan show --key: %d, want P-2 and P-20 to P-25:\n%s", code, out)
	}
	if code, out := runCLI("plan", "show", id, "--config", cfg, "--limit", "0"); code != 2 {
		t.Fatalf("plan show --limit 0: %d, want 2:\n%s", code, out)
	}
}
