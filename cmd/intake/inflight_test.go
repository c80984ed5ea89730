package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// stoppedAt waits until the process p has stopped itself at the fault
// step (the "stop" fault action: SIGSTOP) and is stopped in fact.
func stoppedAt(t *testing.T, p *proc, step string) {
	t.Helper()
	waitFor(t, 2*time.Minute, func() bool {
		if !strings.Contains(p.output(), "fault: stopping the process at "+step) {
			return false
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return false
		}
		// pid (comm) S ...: the state is the field after the last ')'
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return len(f) > 0 && f[0] == "T"
	}, p)
}

// clean runs intake reconcile and intake status and fails the test on
// anything either says needs a human.
func clean(t *testing.T, cfg, when string) {
	t.Helper()
	if code, out := runCLI("reconcile", "--config", cfg); code != 0 || strings.Contains(out, "ATTN") {
		t.Fatalf("%s: intake reconcile exit %d:\n%s", when, code, out)
	}
	if code, out := runCLI("status", "--config", cfg); code != 0 || strings.Contains(out, "ATTN") {
		t.Fatalf("%s: intake status exit %d:\n%s", when, code, out)
	}
}

// A file held for its reject rate and released keeps its reason file in
// quarantine/ until it is archived. While the real daemon applies it
// (stopped mid-chunk, and again after the move to archive/ before its
// row says archived), intake reconcile and intake status find nothing
// for a human; at the end the file is archived with every good row in,
// and its reason file is gone.
func TestAReleaseWhileTheFileAppliesLeavesReconcileAndStatusClean(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "relapply")
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "ra-1", poll: "@every 1s", schedule: "@every 1h", chunkRows: 500,
		feedExtra: "        max_reject_ratio: 0.1\n"})
	const rows = 10000
	var b strings.Builder
	b.WriteString(testenv.OrdersHeader)
	bad := 0
	for i := 1; i <= rows; i++ {
		email := fmt.Sprintf("c%d@example.com", i)
		if i%7 == 0 {
			email, bad = "not-an-email", bad+1
		}
		fmt.Fprintf(&b, "RA-%d,%s,%d.00,paid,2026-11-01T10:00:00Z,%d\n", i, email, i, i)
	}
	site.Drop(t, "orders-ra.csv", b.String())
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once: exit %d\n%s", code, out)
	}
	fs := testenv.Files(t, pool, "relapply")
	if len(fs) != 1 || fs[0].State != "quarantined" || fs[0].Reason != "reject_rate_exceeded" {
		t.Fatalf("files %+v, want one held for its reject rate", fs)
	}
	id := fs[0].ID
	if code, out := runCLI("quarantine", "release", strconv.FormatInt(id, 10), "--hold", holdOf(t, pool, id), "--config", cfg, "--reason", "partner confirmed", "--actor", "ops"); code != 0 {
		t.Fatalf("release: exit %d\n%s", code, out)
	}
	// the released file waits for a reconciler: this one takes it over
	// as ra-1, the daemon's worker id, whose poll then applies it
	code, out := runCLI("reconcile", "--config", cfg)
	if code != 0 || !strings.Contains(out, "lease_expired") {
		t.Fatalf("reconcile after the release: exit %d\n%s", code, out)
	}
	daemon := startIntake(t, url, "apply:mid_chunk=stop@3,archive:mid=stop", "run", "--config", cfg)

	stoppedAt(t, daemon, "apply:mid_chunk")
	if f := liveRow(t, pool, id); f.state != "applying" {
		t.Fatalf("stopped mid-chunk in state %s", f.state)
	}
	if n := len(site.Files(t, "quarantine")); n != 1 {
		t.Fatalf("quarantine/ holds %d entries while the released file applies, want its reason file", n)
	}
	clean(t, cfg, "mid-apply")
	daemon.signal(syscall.SIGCONT)

	stoppedAt(t, daemon, "archive:mid")
	if f := liveRow(t, pool, id); f.state != "applied" {
		t.Fatalf("stopped while archiving in state %s", f.state)
	}
	clean(t, cfg, "mid-archive")
	daemon.signal(syscall.SIGCONT)

	waitFor(t, 2*time.Minute, func() bool { return liveRow(t, pool, id).state == "archived" }, daemon)
	if q := site.Files(t, "quarantine"); len(q) != 0 {
		t.Fatalf("quarantine/ holds %v after the file was archived", q)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'relapply'`); n != int64(rows-bad) {
		t.Fatalf("%d rows landed, want %d", n, rows-bad)
	}
	clean(t, cfg, "archived")
	daemon.signal(syscall.SIGTERM)
	if ws := daemon.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("the daemon exited %v:\n%s", ws, tail(daemon.output()))
	}
}

// intake replay with PostgreSQL crashed (stopped immediately and
// started again) while the command stands at each of its steps, and once
// with the reply to its insert's commit lost. Whatever the command met, it
// named the intake it replayed before anything could fail, and, when it
// failed, either said no replay was recorded (and running it again is
// safe: the test does) or named the replay's row and said not to replay
// again (a second replay is then refused while the row is live, naming
// it). An operator who does what it said ends with exactly one replay of
// the file applied, and nothing for a human.
func TestAReplayWithPostgreSQLCrashingAtEachStepIsAppliedExactlyOnce(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "replaypg")
	cfg := writeConfigOpts(t, site, cfgOpts{worker: "rp-1", schedule: "@every 1h", chunkRows: 100})
	const rows = 1000
	site.Drop(t, "orders-rp.csv", testenv.OrdersCSV("RP", rows))
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once: exit %d\n%s", code, out)
	}
	fs := testenv.Files(t, pool, "replaypg")
	if len(fs) != 1 || fs[0].State != "archived" {
		t.Fatalf("files %+v", fs)
	}
	orig := strconv.FormatInt(fs[0].ID, 10)
	replay := func() (int, string) {
		return runCLI("replay", orig, "--config", cfg, "--reason", "target fixed", "--actor", "ops")
	}
	for _, step := range []struct{ name, fault string }{
		{"ops:before_commit", "pause"}, // inside the insert's transaction
		{"replay:inserted", "error"},   // the insert committed, its reply lost
		{"apply:mid_chunk", "pause@3"}, // inside a chunk's transaction
		{"apply:after_commit", "pause"},
		{"archive:mid", "pause"},
		{"publish:receipt", "pause"},
	} {
		t.Run(step.name, func(t *testing.T) {
			before := testenv.Count(t, pool, `SELECT coalesce(max(intake_id), 0) FROM file_intake`)
			var res cliResult
			if step.fault == "error" {
				if err := fault.Set(step.name + "=error"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { fault.Set("") })
				res.code, res.out = replay()
				fault.Set("")
			} else {
				res = crashedAt(t, pool, step.name+"="+step.fault, replay)
			}
			t.Logf("replay at %s: exit %d\n%s", step.name, res.code, res.out)
			t.Logf("rows: %v", testenv.Strings(t, pool, `SELECT intake_id || ' ' || state || ' ' || worker_id || ' ' || coalesce(replay_of::text, '-') FROM file_intake ORDER BY 1`))
			if !strings.HasPrefix(res.out, "replay of intake "+orig+" by ops, request req-") {
				t.Fatalf("the first line does not name the intake replayed:\n%s", res.out)
			}
			var row int64
			if i := strings.Index(res.out, "replay of intake "+orig+" is intake "); i >= 0 {
				fmt.Sscanf(res.out[i+len("replay of intake "+orig+" is intake "):], "%d", &row)
			}
			switch {
			case res.code == 0:
				if row == 0 {
					t.Fatalf("a replay that succeeded does not name its row:\n%s", res.out)
				}
			case strings.Contains(res.out, "running the replay again is safe"):
				if row != 0 || testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE replay_of IS NOT NULL AND intake_id > $1`, before) != 0 {
					t.Fatalf("said nothing was recorded, yet a replay row exists:\n%s", res.out)
				}
				if code, out := replay(); code != 0 {
					t.Fatalf("the replay run again: exit %d\n%s", code, out)
				}
			default:
				if row == 0 || !strings.Contains(res.out, "Do not replay intake "+orig+" again: intake "+strconv.FormatInt(row, 10)+" is that replay") {
					t.Fatalf("a failed replay does not name its row and what becomes of it:\n%s", res.out)
				}
				if f := liveRow(t, pool, row); f.state != "archived" {
					code, out := replay()
					if code == 0 || !strings.Contains(out, fmt.Sprintf("is live: intake %d", row)) {
						t.Fatalf("a second replay while intake %d is %s: exit %d\n%s", row, f.state, code, out)
					}
				}
				// what the message says: a reconciler takes it over and
				// finishes it (the daemon of its worker id applies it)
				waitFor(t, 2*time.Minute, func() bool {
					runCLI("reconcile", "--config", cfg)
					runCLI("run", "--config", cfg, "--once")
					return liveRow(t, pool, row).state == "archived"
				})
			}
			replays := testenv.Strings(t, pool, `SELECT state FROM file_intake WHERE replay_of IS NOT NULL AND intake_id > $1`, before)
			if len(replays) != 1 || replays[0] != "archived" {
				t.Fatalf("replays of this step: %v, want exactly one, archived", replays)
			}
			if n := testenv.Count(t, pool, `SELECT count(*) FROM orders WHERE partner_id = 'replaypg'`); n != rows {
				t.Fatalf("%d rows in the target, want %d", n, rows)
			}
			clean(t, cfg, "after the replay at "+step.name)
		})
	}
}

// The decisions (quarantine release and discard, approve, reject), each
// with PostgreSQL crashing just before its transaction commits, and each
// with the reply to its commit lost. The crashed one says it was rolled
// back and that running it again is safe, and nothing of it is recorded;
// run again, it takes effect. The one whose reply was lost learns from
// the audit (its request id) that it was recorded and says so, exit 0;
// run once more, it is refused, for the file is decided. Every decision
// is recorded exactly once.
func TestADecisionThatLostItsDatabaseSaysWhatBecameOfIt(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	held := testenv.NewSite(t, "decheld")
	waiting := testenv.NewSite(t, "decwait")
	heldCfg := writeConfigOpts(t, held, cfgOpts{worker: "dec-1"})
	waitCfg := writeConfigOpts(t, waiting, cfgOpts{worker: "dec-2", feedExtra: "        approval: {always: true}\n"})
	for i := 1; i <= 4; i++ {
		held.Drop(t, fmt.Sprintf("orders-%d.csv", i), testenv.OrdersHeader+fmt.Sprintf("H%d-1,bad,1.00,paid,2026-11-01T00:00:00Z,1\n", i))
		waiting.Drop(t, fmt.Sprintf("orders-%d.csv", i), testenv.OrdersCSV(fmt.Sprintf("W%d", i), 2))
	}
	for _, cfg := range []string{heldCfg, waitCfg} {
		if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
			t.Fatalf("run --once: exit %d\n%s", code, out)
		}
	}
	var heldIDs, waitIDs []int64
	for _, f := range testenv.Files(t, pool, "decheld") {
		if f.State == "quarantined" {
			heldIDs = append(heldIDs, f.ID)
		}
	}
	for _, f := range testenv.Files(t, pool, "decwait") {
		if f.State == "awaiting_approval" {
			waitIDs = append(waitIDs, f.ID)
		}
	}
	if len(heldIDs) != 4 || len(waitIDs) != 4 {
		t.Fatalf("held %v, waiting %v", heldIDs, waitIDs)
	}
	planHash := func(id int64) string {
		var h string
		if err := pool.QueryRow(context.Background(), `SELECT plan_hash FROM file_intake WHERE intake_id = $1`, id).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	type decision struct {
		action string
		id     int64
		args   []string
		after  string // the state the decision leaves
	}
	mk := func(cmd []string, id int64, cfg string, extra ...string) []string {
		return append(append(cmd, strconv.FormatInt(id, 10), "--config", cfg, "--reason", "checked", "--actor", "ops"), extra...)
	}
	var ds []decision
	for i := range 2 { // the first four crash, the last four lose their reply
		ds = append(ds,
			decision{"release", heldIDs[2*i], mk([]string{"quarantine", "release"}, heldIDs[2*i], heldCfg, "--hold", holdOf(t, pool, heldIDs[2*i])), "spooled"},
			decision{"discard", heldIDs[2*i+1], mk([]string{"quarantine", "discard"}, heldIDs[2*i+1], heldCfg, "--hold", holdOf(t, pool, heldIDs[2*i+1])), "discarded"},
			decision{"approve", waitIDs[2*i], mk([]string{"approve"}, waitIDs[2*i], waitCfg, "--plan-hash", planHash(waitIDs[2*i])), "spooled"},
			decision{"reject", waitIDs[2*i+1], mk([]string{"reject"}, waitIDs[2*i+1], waitCfg), "spooled"},
		)
	}
	audited := func(d decision) int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM intake_audit WHERE intake_id = $1 AND action = $2`, d.id, d.action)
	}
	for i, d := range ds {
		lost := i >= 4
		name := d.action + "/crashed"
		if lost {
			name = d.action + "/reply_lost"
		}
		t.Run(name, func(t *testing.T) {
			before := liveRow(t, pool, d.id).state
			if lost {
				if err := fault.Set("ops:reply_lost=error"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { fault.Set("") })
				code, out := runCLI(d.args...)
				fault.Set("")
				if code != 0 || !strings.Contains(out, "the reply was lost") || !strings.Contains(out, "the decision is recorded (request req-") {
					t.Fatalf("exit %d\n%s", code, out)
				}
				if f := liveRow(t, pool, d.id); f.state != d.after || audited(d) != 1 {
					t.Fatalf("intake %d is %s with %d audit rows of %s, want %s and one", d.id, f.state, audited(d), d.action, d.after)
				}
				code, out = runCLI(d.args...)
				if code != exitRefused || !strings.Contains(out, "refused, nothing changed") || audited(d) != 1 {
					t.Fatalf("the decision again: exit %d\n%s", code, out)
				}
				return
			}
			r := crashedAt(t, pool, "ops:before_commit=pause", func() (int, string) { return runCLI(d.args...) })
			first := fmt.Sprintf("intake %d: %s by ops, request req-", d.id, d.action)
			if r.code != 1 || !strings.HasPrefix(r.out, first) || !strings.Contains(r.out, "rolled back: nothing changed; running the command again is safe") {
				t.Fatalf("exit %d\n%s", r.code, r.out)
			}
			if f := liveRow(t, pool, d.id); f.state != before || audited(d) != 0 {
				t.Fatalf("rolled back, yet intake %d is %s with %d audit rows", d.id, f.state, audited(d))
			}
			if code, out := runCLI(d.args...); code != 0 {
				t.Fatalf("run again: exit %d\n%s", code, out)
			}
			if f := liveRow(t, pool, d.id); f.state != d.after || audited(d) != 1 {
				t.Fatalf("intake %d is %s with %d audit rows of %s, want %s and one", d.id, f.state, audited(d), d.action, d.after)
			}
		})
	}
}

// cliResult is what a command run in this process said.
type cliResult struct {
	code int
	out  string
}

// crashedAt runs the command cmd with the "pause" fault spec armed (name
// =pause[@n]) and, once it stands there, crashes the test's PostgreSQL
// (an immediate stop, then a start: crash recovery) and lets it go on;
// it returns what the command said in the end.
func crashedAt(t *testing.T, pool *pgxpool.Pool, spec string, cmd func() (int, string)) cliResult {
	t.Helper()
	step, _, _ := strings.Cut(spec, "=")
	if err := fault.Set(spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	done := make(chan cliResult, 1)
	go func() { c, o := cmd(); done <- cliResult{c, o} }()
	select {
	case <-fault.Paused(step):
	case r := <-done:
		t.Fatalf("the command ended before %s: exit %d\n%s", step, r.code, r.out)
	case <-time.After(2 * time.Minute):
		t.Fatalf("the command never reached %s", step)
	}
	pg := testenv.PG()
	if err := pg.StopServer("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // the test's own connections died with the server
	fault.Resume(step)
	var r cliResult
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the command did not end after the crash at %s", step)
	}
	fault.Set("")
	return r
}
