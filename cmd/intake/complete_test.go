package main

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// candidates runs `intake __complete args…` as a shell's completion
// script does and returns the candidates it prints, without their
// descriptions and the directive line.
func candidates(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, errs := runSplit(append([]string{"__complete"}, args...)...)
	if code != 0 {
		t.Fatalf("__complete %q: exit %d\n%s%s", args, code, out, errs)
	}
	var cs []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" || strings.HasPrefix(l, ":") {
			continue
		}
		cs = append(cs, strings.SplitN(l, "\t", 2)[0])
	}
	return cs
}

// nonFlags are the candidates that are not flags.
func nonFlags(cs []string) []string {
	var out []string
	for _, c := range cs {
		if !strings.HasPrefix(c, "-") {
			out = append(out, c)
		}
	}
	return out
}

// A partner id completes from the config, an intake id from the database
// (only the rows in the states the command acts on); without a database,
// or a config, the completion is silently empty.
func TestCompletionOfPartnerAndIntakeIDs(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "complete")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	partner := site.Config.ID

	if got := candidates(t, "status", "--config", cfg, "--partner", ""); !slices.Equal(got, []string{partner}) {
		t.Errorf("status --partner: %q, want %q", got, partner)
	}
	if got := candidates(t, "quarantine", "list", "--config="+cfg, "--partner", partner[:2]); !slices.Equal(got, []string{partner}) {
		t.Errorf("quarantine list --partner %s: %q, want %q", partner[:2], got, partner)
	}
	t.Setenv("INTAKE_CONFIG", cfg)
	if got := candidates(t, "expect", "ack", ""); !slices.Equal(got, []string{partner + "/orders"}) {
		t.Errorf("expect ack (config from INTAKE_CONFIG): %q", got)
	}

	ids := map[string]string{}
	for _, st := range []string{"quarantined", "awaiting_approval", "archived", "claimed"} {
		var id int64
		if err := pool.QueryRow(context.Background(), `INSERT INTO file_intake (partner_id, feed, remote_name, claimed_path, listed_size, state, worker_id, lease_until)
			VALUES ($1, 'orders', $2, '/p/w/' || $2, 1, $3, 'w', now()) RETURNING intake_id`, partner, "orders-"+st+".csv", st).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[st] = strconv.FormatInt(id, 10)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"quarantine", "release", ""}, ids["quarantined"]},
		{[]string{"quarantine", "discard", "--config", cfg, ""}, ids["quarantined"]},
		{[]string{"approve", ""}, ids["awaiting_approval"]},
		{[]string{"reject", "--reason", "x", ""}, ids["awaiting_approval"]},
		{[]string{"replay", ""}, ids["archived"]},
	} {
		if got := nonFlags(candidates(t, c.args...)); !slices.Equal(got, []string{c.want}) {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
	// cobra offers the required flags not yet given beside the ids
	if got := candidates(t, "approve", "--reason", "x", ""); !slices.Contains(got, "--plan-hash") || slices.Contains(got, "--reason") {
		t.Errorf("approve --reason x: %q, want --plan-hash offered, not --reason", got)
	}
	// plan show: the awaiting file among others
	if got := candidates(t, "plan", "show", ""); !slices.Contains(got, ids["awaiting_approval"]) || slices.Contains(got, ids["claimed"]) {
		t.Errorf("plan show: %q", got)
	}

	// A database that does not answer, a config that does not load:
	// nothing, exit 0.
	t.Setenv("INTAKE_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if got := nonFlags(candidates(t, "approve", "")); len(got) != 0 {
		t.Errorf("approve without a database: %q", got)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	if got := candidates(t, "status", "--config", missing, "--partner", ""); len(got) != 0 {
		t.Errorf("status --partner without a config: %q", got)
	}
}

// A mistyped command is refused with exit 2 and the command meant.
func TestMistypedCommandSuggestsTheRightOne(t *testing.T) {
	for typed, want := range map[string]string{"replya": "replay", "qurantine": "quarantine", "statsu": "status"} {
		code, _, errs := runSplit(typed, "--config", "x.yaml")
		if code != 2 || !strings.Contains(errs, "did you mean "+want+"?") {
			t.Errorf("intake %s: exit %d, want 2 suggesting %s:\n%s", typed, code, want, errs)
		}
	}
	if _, _, errs := runSplit("frobnicate"); strings.Contains(errs, "did you mean") {
		t.Errorf("frobnicate got a suggestion:\n%s", errs)
	}
}
