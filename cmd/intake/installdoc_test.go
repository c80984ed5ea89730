package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/internal/pgtemp"
)

// docBlocks are the fenced code blocks of a Markdown file that a marker
// line `<!-- run: NAME -->` right above names: the blocks the tests
// run as they are written (.ci/package-test.sh and .ci/chart-test.sh
// read theirs from docs/install.md with .ci/docblock.sh).
func docBlocks(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{}
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		name, ok := strings.CutPrefix(lines[i], "<!-- run: ")
		if !ok {
			continue
		}
		name = strings.TrimSuffix(name, " -->")
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("%s:%d: marker %q is not right above a fenced block", path, i+1, name)
		}
		var body []string
		for i += 2; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		if _, dup := blocks[name]; dup {
			t.Fatalf("%s: two blocks marked %q", path, name)
		}
		blocks[name] = strings.Join(body, "\n") + "\n"
	}
	return blocks
}

// substitute replaces what a doc block says about a host (its database
// address, its config path) with the test's; each must be in the block,
// so a changed doc fails here instead of running something else.
func substitute(t *testing.T, name, block string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(block, pairs[i]) {
			t.Fatalf("docs/install.md block %q no longer says %q: update this test with the doc", name, pairs[i])
		}
		block = strings.ReplaceAll(block, pairs[i], pairs[i+1])
	}
	return block
}

// docs/install.md's "PostgreSQL: roles and grants", run as written on a
// PostgreSQL of its own: the SQL that creates the roles and the database
// (psql, as a superuser), then `intake migrate` as the owner and `intake
// grants … | psql` with the packaged (example) config. Only the database's
// address and the config's path are the test's. Then the roles do their
// jobs: a person of the ops group runs intake status and intake audit,
// the daemon's role may write the feed's target table and append to the
// audit, and neither may change it.
func TestInstallDocRolesAndGrantsRunAsWritten(t *testing.T) {
	blocks := docBlocks(t, "../../docs/install.md")
	roles, grants := blocks["roles"], blocks["grants"]
	if roles == "" || grants == "" {
		t.Fatalf("docs/install.md has no blocks marked roles and grants: %v", blocks)
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found (postgresql-client)")
	}
	pg, err := pgtemp.Start(pgtemp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	owner := strings.Replace(pg.URL("intake"), "//postgres@", "//intake_owner@", 1)
	as := func(role string) string { return strings.Replace(owner, "//intake_owner@", "//"+role+"@", 1) }
	sh := func(script string, env ...string) string {
		t.Helper()
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n--- script\n%s--- output\n%s", err, script, out)
		}
		return string(out)
	}

	cmd := exec.Command(psql, pg.URL("postgres"), "-v", "ON_ERROR_STOP=1", "-q")
	cmd.Stdin = strings.NewReader(roles)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the roles block: %v\n%s\n%s", err, roles, out)
	}
	// The operator's target table of the example config's feed, made by
	// its owner (docs/target-tables.md): intake grants names it.
	ctx := context.Background()
	c, err := pgx.Connect(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `CREATE SCHEMA sales; CREATE TABLE sales.orders (partner_id text NOT NULL, order_id text NOT NULL, amount numeric, UNIQUE (partner_id, order_id))`); err != nil {
		t.Fatal(err)
	}

	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(buildIntake(t, ""), filepath.Join(bin, "intake")); err != nil {
		t.Fatal(err)
	}
	example, err := filepath.Abs("../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	script := substitute(t, "grants", grants,
		"postgres://intake_owner@db/intake?sslmode=verify-full", owner,
		"/etc/intake/intake.yaml", example)
	path := "PATH=" + bin + string(os.PathListSeparator) + filepath.Dir(psql) + string(os.PathListSeparator) + os.Getenv("PATH")
	sh(script, path, "INTAKE_DATABASE_URL=")

	// a person of the ops group reads the ledger
	for _, args := range [][]string{{"status", "--config", example}, {"audit", "--config", example}} {
		cmd := exec.Command(filepath.Join(bin, "intake"), args...)
		cmd.Env = append(os.Environ(), "INTAKE_DATABASE_URL="+as("alice"))
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code > 1 || strings.Contains(string(out), "permission denied") || strings.Contains(string(out), "SQLSTATE 42501") {
			t.Errorf("intake %s as alice (intake_ops): exit %d %v\n%s", args[0], code, err, out)
		}
	}
	// what each role may do, as PostgreSQL says
	for _, q := range []struct {
		sql  string
		want bool
	}{
		{`SELECT has_table_privilege('intake', 'sales.orders', 'INSERT, UPDATE')`, true},
		{`SELECT has_table_privilege('intake', 'intake.intake_audit', 'INSERT')`, true},
		{`SELECT has_table_privilege('intake', 'intake.intake_audit', 'UPDATE') OR has_table_privilege('intake', 'intake.intake_audit', 'DELETE')`, false},
		{`SELECT has_table_privilege('alice', 'intake.intake_feed_late', 'SELECT') AND has_table_privilege('alice', 'intake.intake_outbox_delivery', 'SELECT')`, true},
		{`SELECT has_table_privilege('alice', 'sales.orders', 'INSERT')`, false},
		{`SELECT has_function_privilege('intake_purge', 'intake.intake_purge_audit(text, timestamptz)', 'EXECUTE')`, true},
	} {
		var got bool
		if err := c.QueryRow(ctx, q.sql).Scan(&got); err != nil || got != q.want {
			t.Errorf("%s: %v %v, want %v", q.sql, got, err, q.want)
		}
	}
}
