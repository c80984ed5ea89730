package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// `intake check` compares each feed column with its target column: a
// varchar shorter than the feed's max_length fails naming partner, feed
// and column; a CHECK constraint is a warning and check still passes; a
// matching target is clean. `intake run` logs the findings and runs.
func TestCheckComparesFeedColumnsWithTheTarget(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "colcheck")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}

	code, out := runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "ok   partner colcheck feed orders: every value the feed accepts fits its target column") ||
		strings.Contains(out, "warn partner") || strings.Contains(out, "its own way") {
		t.Fatalf("check of a matching target exited %d:\n%s", code, out)
	}

	// a key the target compares its own way (intake/target/keys.go) is
	// told, and how intake writes it
	exec(`CREATE EXTENSION IF NOT EXISTS citext; ALTER TABLE orders ALTER COLUMN order_id TYPE citext`)
	code, out = runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "the target compares key order_id (citext, compared under pg_catalog.\"default\") its own way: every chunk is deduplicated in SQL") {
		t.Fatalf("check of a citext key exited %d, want 0 and the key told:\n%s", code, out)
	}
	exec(`ALTER TABLE orders ALTER COLUMN order_id TYPE text`)

	exec(`ALTER TABLE orders ALTER COLUMN order_id TYPE varchar(8), ALTER COLUMN qty TYPE smallint`)
	code, out = runCLI("check", "--config", cfg)
	for _, w := range []string{
		"FAIL partner colcheck feed orders column order_id: is character varying(8): holds 8 characters, the feed accepts up to 32",
		"FAIL partner colcheck feed orders column qty: is smallint: out of range for values of 9 digits",
		"2 problem(s) found",
	} {
		if code != 1 || !strings.Contains(out, w) {
			t.Fatalf("check exited %d, want 1 and %q:\n%s", code, w, out)
		}
	}

	// `intake run` logs the same findings as errors and runs on: a value
	// refused at run time is met row by row
	code, out = runCLI("run", "--config", cfg, "--once")
	if code != 0 || !strings.Contains(out, "target may refuse values the feed accepts") || !strings.Contains(out, `"column":"order_id"`) {
		t.Fatalf("run --once exited %d, want 0 with the findings logged:\n%s", code, out)
	}

	exec(`ALTER TABLE orders ALTER COLUMN order_id TYPE text, ALTER COLUMN qty TYPE integer`)
	exec(`ALTER TABLE orders ADD CONSTRAINT qty_positive CHECK (qty > 0)`)
	code, out = runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "warn partner colcheck feed orders column qty: CHECK constraint qty_positive") {
		t.Fatalf("check with a CHECK constraint exited %d, want 0 and a warning:\n%s", code, out)
	}
}

// `intake check` fails while a role other than a schema's owner (PUBLIC
// included) may create in a schema on the daemon's search_path: a
// function it plants there could run as intake's role. It names the role
// and the REVOKE that fixes it, and passes once revoked.
func TestCheckFailsWhenARoleMayCreateOnTheSearchPath(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "pathcheck")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	const ok = "ok   database: no role but its owner may create in a schema on intake's search_path (pg_catalog, intake, public)"
	code, out := runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, ok) {
		t.Fatalf("check of a public schema only its owner may create in exited %d:\n%s", code, out)
	}

	exec(`GRANT CREATE ON SCHEMA public TO PUBLIC`)
	code, out = runCLI("check", "--config", cfg)
	for _, w := range []string{
		"FAIL database: PUBLIC may create in schema public, on intake's search_path (pg_catalog, intake, public): a function or operator it creates there can run as intake's role; REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"1 problem(s) found",
	} {
		if code != 1 || !strings.Contains(out, w) {
			t.Fatalf("check with CREATE granted to PUBLIC exited %d, want 1 and %q:\n%s", code, w, out)
		}
	}
	exec(`REVOKE CREATE ON SCHEMA public FROM PUBLIC`)

	var role string
	if err := pool.QueryRow(context.Background(), `SELECT 'Planter_' || current_database()`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	exec(`CREATE ROLE "` + role + `" NOLOGIN; GRANT CREATE ON SCHEMA public TO "` + role + `"`)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP OWNED BY "`+role+`"; DROP ROLE "`+role+`"`) })
	code, out = runCLI("check", "--config", cfg)
	if w := "FAIL database: " + role + " may create in schema public, on intake's search_path (pg_catalog, intake, public): a function or operator it creates there can run as intake's role; REVOKE CREATE ON SCHEMA public FROM \"" + role + "\""; code != 1 || !strings.Contains(out, w) {
		t.Fatalf("check with CREATE granted to a role exited %d, want 1 and %q:\n%s", code, w, out)
	}

	exec(`REVOKE CREATE ON SCHEMA public FROM "` + role + `"`)
	// the ledger's own schema is on the path too
	exec(`GRANT CREATE ON SCHEMA intake TO "` + role + `"`)
	code, out = runCLI("check", "--config", cfg)
	if w := "FAIL database: " + role + " may create in schema intake, on intake's search_path"; code != 1 || !strings.Contains(out, w) {
		t.Fatalf("check with CREATE on the ledger's schema granted to a role exited %d, want 1 and %q:\n%s", code, w, out)
	}
	exec(`REVOKE CREATE ON SCHEMA intake FROM "` + role + `"`)
	code, out = runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, ok) {
		t.Fatalf("check after the REVOKE exited %d, want 0:\n%s", code, out)
	}
}

// `intake check` on a read-only account (internal-sftp -R): under the
// default claim by rename it fails and says the account fits only claim:
// record; configured with readiness stable and claim: record it passes.
func TestCheckSaysAReadOnlySiteFitsClaimRecord(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	srv, err := sshdtest.StartSFTP("-R")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root, err := srv.PartnerRoot("rocheck")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "ready"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ready", "orders-1.csv"), []byte(testenv.OrdersHeader), 0o644); err != nil {
		t.Fatal(err)
	}
	site := &testenv.Site{Root: root, Config: partners.Config{ID: "rocheck", SFTP: partners.SFTP{Address: srv.Addr,
		User: srv.User, PrivateKeyFile: srv.ClientKeyFile, KnownHostsFile: srv.KnownHostsFile, Root: root}}}
	cfg := writeConfig(t, site, srv.KnownHostsFile)
	code, out := runCLI("check", "--config", cfg)
	if code != 1 || !strings.Contains(out, "FAIL partner rocheck") ||
		!strings.Contains(out, "access in ready/: list yes, read yes, create no") ||
		!strings.Contains(out, "fits only readiness: stable with claim: record") {
		t.Fatalf("check of a read-only site under claim by rename exited %d:\n%s", code, out)
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := strings.Replace(string(b), "    sftp:\n", "    readiness: stable\n    claim: record\n    sftp:\n", 1)
	if err := os.WriteFile(cfg, []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, "ok   partner rocheck: host key pinned, login, ready/ listable and readable (claim: record") {
		t.Fatalf("check of a read-only site under claim: record exited %d:\n%s", code, out)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "ready")); len(ents) != 1 {
		t.Fatalf("ready/ holds %d entries after check, want the partner's file alone", len(ents))
	}
}

// A snapshot feed whose delete guard is off deletes whatever a truncated
// file lacks with no one asked: `intake check` says so (a warning: the
// config may mean it).
func TestCheckWarnsOfASnapshotWithoutADeleteGuard(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "guard")
	const warning = "warn partner guard feed orders: a snapshot without a delete guard (delete_guard.off)"
	for _, c := range []struct {
		extra string
		warns bool
	}{
		{"        mode: snapshot\n", false},
		{"        mode: snapshot\n        delete_guard: {off: true}\n", true},
	} {
		cfg := writeConfigOpts(t, site, cfgOpts{knownHosts: site.Config.SFTP.KnownHostsFile, feedExtra: c.extra})
		code, out := runCLI("check", "--config", cfg)
		if code != 0 || strings.Contains(out, warning) != c.warns {
			t.Fatalf("check of a feed with %q exited %d, want 0 and the warning %v:\n%s", c.extra, code, c.warns, out)
		}
	}
}

// `intake check` warns when two partners log in to one SFTP account (the
// same address and user, each with its own root): each could read,
// replace or link to the other's files. The warning names both partners
// and the account; check still passes. Partners on accounts of their own
// get no such line.
func TestCheckWarnsWhenPartnersShareAnSFTPAccount(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	alpha := testenv.NewSite(t, "alpha")
	beta := testenv.NewSite(t, "beta")
	if alpha.Config.SFTP.Address != beta.Config.SFTP.Address || alpha.Config.SFTP.User != beta.Config.SFTP.User {
		t.Fatal("the two sites must be one account")
	}
	alone := writeConfig(t, alpha, alpha.Config.SFTP.KnownHostsFile)
	code, out := runCLI("check", "--config", alone)
	if code != 0 || strings.Contains(out, "share one SFTP account") {
		t.Fatalf("check of one partner exited %d, want 0 and no warning:\n%s", code, out)
	}

	// beta's partner entry appended to alpha's config (partners: is last)
	a, err := os.ReadFile(alone)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(writeConfig(t, beta, beta.Config.SFTP.KnownHostsFile))
	if err != nil {
		t.Fatal(err)
	}
	_, betaEntry, ok := strings.Cut(string(b), "partners:\n")
	if !ok {
		t.Fatalf("no partners: in\n%s", b)
	}
	both := filepath.Join(t.TempDir(), "intake.yaml")
	if err := os.WriteFile(both, append(a, betaEntry...), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI("check", "--config", both)
	w := "warn partners alpha, beta share one SFTP account (" + alpha.Config.SFTP.User + "@" + alpha.Config.SFTP.Address + ")"
	if code != 0 || !strings.Contains(out, w) || strings.Contains(out, "one tree") {
		t.Fatalf("check of two partners on one account exited %d, want 0 and %q:\n%s", code, w, out)
	}

	// beta's root spelled as a link to alpha's: one tree, as the server
	// resolves it, which check fails
	alias := filepath.Join(filepath.Dir(alpha.Root), "alias-of-"+filepath.Base(alpha.Root))
	if err := os.Symlink(alpha.Root, alias); err != nil {
		t.Fatal(err)
	}
	beta.Config.SFTP.Root = alias
	b, err = os.ReadFile(writeConfig(t, beta, beta.Config.SFTP.KnownHostsFile))
	if err != nil {
		t.Fatal(err)
	}
	_, betaEntry, _ = strings.Cut(string(b), "partners:\n")
	if err := os.WriteFile(both, append(a, betaEntry...), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI("check", "--config", both)
	if w := "FAIL partners alpha and beta: one tree on their server"; code != 1 || !strings.Contains(out, w) {
		t.Fatalf("check of two partners on one tree exited %d, want 1 and %q:\n%s", code, w, out)
	}
}

// `intake check` warns for a partner configured with
// sftp.legacy_algorithms (SHA-1 SSH algorithms offered to its site) and
// still passes; without it, no such line.
func TestCheckWarnsForLegacySSHAlgorithms(t *testing.T) {
	url, _ := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "oldssh")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	code, out := runCLI("check", "--config", cfg)
	if code != 0 || strings.Contains(out, "legacy_algorithms") {
		t.Fatalf("check without legacy_algorithms exited %d, want 0 and no warning:\n%s", code, out)
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	legacy := strings.Replace(string(b), "    feeds:\n", "      legacy_algorithms: true\n    feeds:\n", 1)
	if err := os.WriteFile(cfg, []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runCLI("check", "--config", cfg)
	if w := "warn partner oldssh sftp.legacy_algorithms: SHA-1 SSH algorithms"; code != 0 || !strings.Contains(out, w) {
		t.Fatalf("check with legacy_algorithms exited %d, want 0 and %q:\n%s", code, w, out)
	}
}

// `intake check` fails for a function a target table calls as intake's
// role, from a trigger, a column default, a CHECK of a column's domain or
// an index expression, unless it is pg_catalog's or its owner is in
// database.trusted_function_owners; it names what calls it, the function
// and its owner.
func TestCheckFailsForATargetCallingAnUntrustedFunction(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "fncheck")
	cfg := writeConfig(t, site, site.Config.SFTP.KnownHostsFile)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	const ok = "ok   partner fncheck feed orders: target orders calls no function but pg_catalog's"
	code, out := runCLI("check", "--config", cfg)
	if code != 0 || !strings.Contains(out, ok) {
		t.Fatalf("check of a target calling no function exited %d:\n%s", code, out)
	}

	var role string
	if err := pool.QueryRow(context.Background(), `SELECT 'owner_' || pg_catalog.current_database()`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	exec(`CREATE ROLE "` + role + `" NOLOGIN; CREATE SCHEMA tfn AUTHORIZATION "` + role + `"`)
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP OWNED BY "`+role+`" CASCADE; DROP ROLE "`+role+`"`) })
	exec(`CREATE FUNCTION tfn.stamp() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
		CREATE FUNCTION tfn.dflt() RETURNS text LANGUAGE sql AS $$SELECT 'x'$$;
		CREATE FUNCTION tfn.norm(text) RETURNS text LANGUAGE sql IMMUTABLE AS $$SELECT pg_catalog.lower($1)$$;
		CREATE FUNCTION tfn.fine(text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$SELECT true$$;
		ALTER FUNCTION tfn.stamp() OWNER TO "` + role + `";
		ALTER FUNCTION tfn.dflt() OWNER TO "` + role + `";
		ALTER FUNCTION tfn.norm(text) OWNER TO "` + role + `";
		ALTER FUNCTION tfn.fine(text) OWNER TO "` + role + `"`)
	failsWith := func(what, want string) {
		t.Helper()
		code, out := runCLI("check", "--config", cfg)
		w := "FAIL partner fncheck feed orders: target orders: " + want + ", owned by " + role + ", not in database.trusted_function_owners: it runs as intake's role"
		if code != 1 || !strings.Contains(out, w) || strings.Contains(out, ok) {
			t.Fatalf("check of a target with %s exited %d, want 1 and %q:\n%s", what, code, w, out)
		}
	}

	exec(`CREATE TRIGGER stamp BEFORE INSERT OR UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION tfn.stamp()`)
	failsWith("a trigger", "trigger stamp calls tfn.stamp()")
	// `intake run` logs it at start and runs on
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 || !strings.Contains(out, "target calls a function of an untrusted owner") ||
		!strings.Contains(out, `"function":"tfn.stamp()"`) || !strings.Contains(out, `"owner":"`+role+`"`) {
		t.Fatalf("run --once exited %d, want 0 with the call logged:\n%s", code, out)
	}

	// the owner allowlisted: the same target passes
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	trusting := filepath.Join(t.TempDir(), "trusting.yaml")
	text := strings.Replace(string(raw), "  url_env: INTAKE_DATABASE_URL\n", "  url_env: INTAKE_DATABASE_URL\n  trusted_function_owners: [\""+role+"\"]\n", 1)
	if text == string(raw) {
		t.Fatal("the test config has no url_env line to extend")
	}
	if err := os.WriteFile(trusting, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI("check", "--config", trusting); code != 0 || !strings.Contains(out, ok) {
		t.Fatalf("check with the function's owner trusted exited %d, want 0:\n%s", code, out)
	}
	exec(`DROP TRIGGER stamp ON orders`)

	exec(`ALTER TABLE orders ALTER COLUMN email SET DEFAULT tfn.dflt()`)
	failsWith("a column default", "default of column email calls tfn.dflt()")
	exec(`ALTER TABLE orders ALTER COLUMN email DROP DEFAULT`)

	exec(`CREATE INDEX orders_norm ON orders (tfn.norm(order_id))`)
	failsWith("an index expression", "index orders_norm calls tfn.norm(text)")
	exec(`DROP INDEX orders_norm`)

	exec(`CREATE DOMAIN tfn.state AS text CHECK (tfn.fine(VALUE)); ALTER TABLE orders ALTER COLUMN status TYPE tfn.state`)
	failsWith("a domain CHECK", "CHECK constraint state_check of domain tfn.state calls tfn.fine(text)")
	exec(`ALTER TABLE orders ALTER COLUMN status TYPE text`)

	// an operator stands for its function: a CHECK of the table using one
	exec(`CREATE FUNCTION tfn.near(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$SELECT true$$;
		ALTER FUNCTION tfn.near(text, text) OWNER TO "` + role + `";
		CREATE OPERATOR tfn.~~~ (LEFTARG = text, RIGHTARG = text, FUNCTION = tfn.near);
		ALTER TABLE orders ADD CONSTRAINT near_check CHECK (order_id OPERATOR(tfn.~~~) 'x')`)
	failsWith("an operator in a CHECK", "CHECK constraint near_check calls tfn.near(text,text)")
	exec(`ALTER TABLE orders DROP CONSTRAINT near_check`)

	if code, out := runCLI("check", "--config", cfg); code != 0 || !strings.Contains(out, ok) {
		t.Fatalf("check after the calls were removed exited %d, want 0:\n%s", code, out)
	}

	// a partitioned target: rows land in its partitions, whose triggers
	// run too
	exec(`ALTER TABLE orders RENAME TO orders_flat;
		CREATE TABLE orders (LIKE orders_flat INCLUDING ALL) PARTITION BY LIST (partner_id);
		CREATE TABLE orders_fncheck PARTITION OF orders FOR VALUES IN ('fncheck');
		CREATE TRIGGER stamp BEFORE INSERT ON orders_fncheck FOR EACH ROW EXECUTE FUNCTION tfn.stamp()`)
	failsWith("a partition's trigger", "trigger stamp on partition orders_fncheck calls tfn.stamp()")
}

// `intake check` names every environment variable the config refers to
// that is not set, by its key, and stops there (exit 2) before it dials a
// site: a config that passes check does not stop the daemon on a missing
// secret later. Set, the same config goes on to the sites.
func TestCheckNamesEveryUnsetEnvironmentVariable(t *testing.T) {
	site := testenv.NewSite(t, "unsetenv")
	t.Setenv("INTAKE_DATABASE_URL", "")
	t.Setenv("INTAKE_TEST_HOOK_A", "")
	t.Setenv("INTAKE_TEST_HOOK_B", "")
	cfg := writeConfigOpts(t, site, cfgOpts{})
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hook := "notify:\n  - {url: \"https://hooks.example/intake\", secret_env: INTAKE_TEST_HOOK_A, secret_envs: [INTAKE_TEST_HOOK_B], events: [failed]}\n"
	if err := os.WriteFile(cfg, []byte(hook+string(raw)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runCLI("check", "--config", cfg)
	for _, want := range []string{
		"FAIL database.url_env: environment variable INTAKE_DATABASE_URL is not set",
		"FAIL notify[0].secret_env: environment variable INTAKE_TEST_HOOK_A is not set",
		"FAIL notify[0].secret_envs[0]: environment variable INTAKE_TEST_HOOK_B is not set",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("check lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	if code != 2 || strings.Contains(out, "partner unsetenv") {
		t.Fatalf("check exited %d, want 2 before probing the partner:\n%s", code, out)
	}

	t.Setenv("INTAKE_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	t.Setenv("INTAKE_TEST_HOOK_A", "a")
	t.Setenv("INTAKE_TEST_HOOK_B", "b")
	if _, out := runCLI("check", "--config", cfg); strings.Contains(out, "is not set") || !strings.Contains(out, "partner unsetenv") {
		t.Fatalf("with every variable set, check still names one or did not reach the partner:\n%s", out)
	}
}
