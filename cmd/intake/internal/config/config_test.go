package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners"
)

func TestExampleConfigIsValid(t *testing.T) {
	f, err := Load("../../../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// the example sets no worker_id: it is the host name
	host, _ := os.Hostname()
	if f.WorkerID != host || host == "" || len(f.Partners) != 1 || f.Partners[0].Feeds[0].Key[0] != "order_id" {
		t.Fatalf("got %+v", f)
	}
	if f.Database.URLEnv != "INTAKE_DATABASE_URL" {
		t.Fatalf("got url_env %q", f.Database.URLEnv)
	}
	if f.Affinity != "partner" || f.Intake().Affinity != "partner" {
		t.Fatalf("affinity %q, want partner", f.Affinity)
	}
	if f.Partners[0].GroupFiles != partners.DefaultGroupFiles {
		t.Fatalf("group_files %d, want %d", f.Partners[0].GroupFiles, partners.DefaultGroupFiles)
	}
}

// The example's commented stable block, switched on, loads as documented.
func TestExampleStableBlockLoads(t *testing.T) {
	s := strings.Replace(example(t), "readiness: rename ", "readiness: stable ", 1)
	s = strings.Replace(s, "    #   stable_for:", "      stable_for:", 1)
	s = strings.Replace(s, "    #   min_age:", "      min_age:", 1)
	s = strings.Replace(s, "    #   ignore:", "      ignore:", 1)
	s = strings.Replace(s, "\n    # stable:", "\n    stable:", 1)
	f, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	st := f.Partners[0].Stable
	if f.Partners[0].Readiness != partners.ReadinessStable || st.StableFor != time.Minute || st.MinAge != time.Minute ||
		strings.Join(st.Ignore, ",") != strings.Join(partners.DefaultStableIgnore, ",") {
		t.Fatalf("got %s %+v", f.Partners[0].Readiness, st)
	}
}

func example(t *testing.T) string {
	b, err := os.ReadFile("../../../../configs/intake.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(string) string
		wantAll []string
	}{
		{"an unknown key is refused with its line", func(s string) string {
			return strings.Replace(s, "    poll: ", "    pol: ", 1)
		}, []string{"field pol not found"}},
		{"a misspelt nested key is refused", func(s string) string {
			return strings.Replace(s, "known_hosts_file:", "known_host_file:", 1)
		}, []string{"known_host_file"}},
		{"a missing known_hosts file is refused: no unpinned connections", func(s string) string {
			return strings.Replace(s, "      known_hosts_file: /etc/intake/known_hosts/acme # required: host keys are always pinned\n", "", 1)
		}, []string{"known_hosts_file", "required"}},
		{"a bad readiness mode names the key", func(s string) string {
			return strings.Replace(s, "readiness: rename", "readiness: mtime", 1)
		}, []string{"readiness", "mtime"}},
		{"a key column that is not declared", func(s string) string {
			return strings.Replace(s, "key: [order_id]", "key: [order_no]", 1)
		}, []string{"feeds[0]", "key", "order_no"}},
		{"a bad partner id", func(s string) string {
			return strings.Replace(s, "- id: acme", "- id: ../etc", 1)
		}, []string{"partners[0].id"}},
		{"a regex batch id needs a capture group", func(s string) string {
			return strings.Replace(s, "group: 1", "group: 2", 1)
		}, []string{"batch_id.group"}},
		{"an unknown affinity mode", func(s string) string {
			return strings.Replace(s, "affinity: partner", "affinity: sticky", 1)
		}, []string{"affinity", "sticky"}},
		{"a group larger than allowed", func(s string) string {
			return strings.Replace(s, "group_files: 32", "group_files: 300", 1)
		}, []string{"partners[0] (id acme).group_files", "between 1 and 256"}},
		{"a pool of one connection", func(s string) string {
			return strings.Replace(s, "max_conns: 0", "max_conns: 1", 1)
		}, []string{"database.max_conns", "between 2 and 500"}},
		{"a pattern that is not a regexp by itself, though it would compile once anchored", func(s string) string {
			return replacePattern(t, s, `a)|(?:b`)
		}, []string{"feeds[0]", "pattern", "unexpected )"}},
		{"both url and url_env", func(s string) string {
			return strings.Replace(s, "  url_env: INTAKE_DATABASE_URL", "  url_env: X\n  url: postgres://x", 1)
		}, []string{"url or url_env"}},
		{"an empty trusted function owner", func(s string) string {
			return strings.Replace(s, "  trusted_function_owners: []", "  trusted_function_owners: [app_owner, \"\"]", 1)
		}, []string{"database.trusted_function_owners[1]", "not a role name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.edit(example(t))
			if src == example(t) {
				t.Fatal("edit changed nothing")
			}
			if i := strings.Index(src, "pol: "); i >= 0 {
				// the line of an unknown key is part of the message
				tt.wantAll = append(tt.wantAll, "line "+strconv.Itoa(1+strings.Count(src[:i], "\n")))
			}
			_, err := Parse([]byte(src))
			if err == nil {
				t.Fatal("got no error")
			}
			for _, w := range tt.wantAll {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// Every interval and retention of the config is refused when negative,
// by its key: a negative setting is a ticker that panics (keepalive), a
// dial that always times out, or a cutoff in the future that purges every
// receipt on the partners' sites (retention.reports).
func TestEveryNegativeIntervalIsRefusedByItsKey(t *testing.T) {
	for _, c := range []struct{ line, key string }{
		{"lease: 2m", "lease"},
		{"drain: 30s", "drain"},
		{"  within: 6h", "retry"},
		{"  base: 5s", "retry"},
		{"  max: 10m", "retry"},
		{"  idle_close: 15m", "sessions.idle_close"},
		{"poll_stagger: 50ms", "poll_stagger"},
		{"expect_check: 15s", "expect_check"},
		{"  spool: 720h", "retention.spool"},
		{"  row_issues: 2160h", "retention.row_issues"},
		{"  reports: 2160h", "retention.reports"},
		{"  audit: 9600h", "retention.audit"},
		{"  partner_timeout: 10m", "retention.partner_timeout"},
		{"  stale_temp: 10m", "stale_temp"},
		{"  partner_timeout: 5m", "reconcile.partner_timeout"},
		{"  timeout: 10s", "notify_delivery"},
		{"  min_backoff: 5s", "notify_delivery"},
		{"  max_backoff: 15m", "notify_delivery"},
		{"  budget: 72h", "notify_delivery"},
		{"  poll: 2s", "notify_delivery"},
		{"  keep: 720h", "notify_delivery"},
		{"      dial_timeout: 15s", "sftp.dial_timeout"},
		{"      keepalive: 15s", "sftp.keepalive"},
		{"      op_timeout: 60s", "sftp.op_timeout"},
		{"      stale_upload: 6h", "limits"},
	} {
		t.Run(c.line, func(t *testing.T) {
			src := example(t)
			i := strings.Index(src, "\n"+c.line)
			if i < 0 {
				t.Fatalf("the example has no line %q", c.line)
			}
			k := strings.Index(c.line, ": ")
			neg := c.line[:k+2] + "-1s"
			src = src[:i+1] + neg + src[i+1+len(c.line):]
			_, err := Parse([]byte(src))
			if err == nil {
				t.Fatalf("%s loaded", neg)
			}
			if !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error %q does not name %s", err, c.key)
			}
		})
	}
}

// replacePattern sets the example's first feed pattern.
func replacePattern(t *testing.T, s, pattern string) string {
	i := strings.Index(s, "pattern: ")
	if i < 0 {
		t.Fatal("the example has no feed pattern")
	}
	j := strings.Index(s[i:], "\n")
	return s[:i] + "pattern: '" + pattern + "'" + s[i+j:]
}

// A secret typed where the name of its environment variable goes is
// refused at load without being printed back: the database URL, an SFTP
// password, a PGP passphrase. An ops listen address without a port is
// refused by its key.
func TestASecretInPlaceOfItsVariablesNameIsNotPrintedBack(t *testing.T) {
	for _, c := range []struct{ name, old, new, key, secret string }{
		{"database url", "  url_env: INTAKE_DATABASE_URL", "  url_env: postgres://intake:s3cret@db/intake", "database.url_env", "s3cret"},
		{"sftp password", "      private_key_file: /etc/intake/keys/acme        # or password_file / password_env",
			"      password_env: hunter2 is my password", "sftp.password_env", "hunter2"},
		{"listen address", "  listen: 127.0.0.1:9464", "  listen: 0.0.0.0", "http.listen", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := example(t)
			if !strings.Contains(src, c.old) {
				t.Fatalf("the example has no line %q", c.old)
			}
			_, err := Parse([]byte(strings.Replace(src, c.old, c.new, 1)))
			if err == nil {
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), c.key) || (c.secret != "" && strings.Contains(err.Error(), c.secret)) {
				t.Fatalf("error %q: want it to name %s and not print the secret", err, c.key)
			}
		})
	}
	pgp := partners.PGP{PrivateKeyFile: "/k", PassphraseEnv: "correct horse battery"}
	if err := pgp.Validate("partners[0].feeds[0].pgp"); err == nil || strings.Contains(err.Error(), "horse") || !strings.Contains(err.Error(), "passphrase_env") {
		t.Fatalf("pgp passphrase_env: %v", err)
	}
}

// A partner's SSH key or password file that others than intake's user
// may read is refused at load, naming the partner's key, the file and its
// mode; the same file at 0600 loads.
func TestASecretFileOthersMayReadIsRefusedAtLoad(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "acme.key")
	if err := os.WriteFile(key, []byte("not parsed at load\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "intake.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const exampleKey = "private_key_file: /etc/intake/keys/acme"
	withKey := strings.Replace(example(t), exampleKey, "private_key_file: "+key, 1)
	withPassword := strings.Replace(example(t), exampleKey, "password_file: "+key, 1)
	if withKey == example(t) || withPassword == example(t) {
		t.Fatal("the example's private_key_file line moved")
	}
	const examplePGP = "        # pgp:\n        #   private_key_file: /etc/intake/pgp/intake-secret.asc"
	withPGP := strings.Replace(example(t), examplePGP, "        pgp:\n          private_key_file: "+key, 1)
	if withPGP == example(t) {
		t.Fatal("the example's pgp lines moved")
	}
	for _, tc := range []struct {
		name, config, setting string
	}{
		{"private key", withKey, "sftp.private_key_file"},
		{"password", withPassword, "sftp.password_file"},
		{"pgp secret key", withPGP, "feeds[0] (name orders).pgp.private_key_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write(tc.config)
			for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o602} {
				if err := os.Chmod(key, mode); err != nil {
					t.Fatal(err)
				}
				_, err := Load(cfg)
				want := "partners[0] (id acme)." + tc.setting + ": " + key + " is mode " + fmt.Sprintf("%04o", mode)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("mode %04o: %v, want an error with %q", mode, err, want)
				}
			}
			for _, mode := range []os.FileMode{0o600, 0o400} {
				if err := os.Chmod(key, mode); err != nil {
					t.Fatal(err)
				}
				if _, err := Load(cfg); err != nil {
					t.Fatalf("mode %04o: %v", mode, err)
				}
			}
		})
	}
}

// Which modes of a secret file pass: none with a bit for others; group
// bits only on a file someone else owns (root) whose group is intake's
// (root:intake 0640, a Kubernetes secret 0440 root:fsGroup).
func TestSecretModeOK(t *testing.T) {
	const uid, gid, root, other = 1000, 1000, 0, 2000
	for _, tc := range []struct {
		perm         os.FileMode
		owner, group int
		ok           bool
	}{
		{0o600, uid, gid, true},
		{0o400, uid, gid, true},
		{0o640, uid, gid, false},    // its own: group bits of no use
		{0o640, root, gid, true},    // root:intake 0640
		{0o440, root, gid, true},    // a Kubernetes secret with fsGroup
		{0o640, root, other, false}, // readable by another group
		{0o644, root, gid, false},
		{0o604, uid, gid, false},
		{0o602, uid, gid, false},
		{0o640, -1, -1, false}, // owner unknown
	} {
		if got := secretModeOK(tc.perm, tc.owner, tc.group, uid, gid); got != tc.ok {
			t.Errorf("mode %04o owner %d group %d: ok %v, want %v", tc.perm, tc.owner, tc.group, got, tc.ok)
		}
	}
}

// A webhook's URL must be https unless its host is loopback: plain http
// to any other host is refused at load, naming the key; http to
// localhost, 127.0.0.0/8 and ::1 loads.
func TestPlainHTTPWebhookToAnOutsideHostIsRefusedAtLoad(t *testing.T) {
	const global = "  - url: https://hooks.example.com/intake  # https; plain http only to localhost, 127.0.0.0/8 or ::1\n"
	for _, u := range []string{"http://hooks.example.com/intake", "http://10.0.0.5:8080/hook", "http://[2001:db8::1]/hook", "http://localhost.example.com/"} {
		src := strings.Replace(example(t), global, "  - url: "+u+"\n", 1)
		if src == example(t) {
			t.Fatal("edit changed nothing")
		}
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), "notify[0].url") || !strings.Contains(err.Error(), "https") {
			t.Fatalf("%s: error %v, want notify[0].url refused for plain http", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:9000/hook", "http://127.8.0.1/hook", "http://[::1]:8080/hook", "http://localhost:8080/hook", "https://hooks.example.com/other"} {
		if _, err := Parse([]byte(strings.Replace(example(t), global, "  - url: "+u+"\n", 1))); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
	}
	// a partner's webhook may not take a global webhook's id (ops-hook in
	// the example) with another URL
	src := strings.Replace(example(t), "      - url: https://ops.acme-team.example/hooks/intake\n", "      - url: https://ops.acme-team.example/hooks/intake\n        id: ops-hook\n", 1)
	if src == example(t) {
		t.Fatal("edit changed nothing")
	}
	if _, err := Parse([]byte(src)); err == nil || !strings.Contains(err.Error(), `"ops-hook" is the id of a global webhook`) {
		t.Fatalf("a partner webhook sharing a global webhook's id: %v", err)
	}
}

// The console: block loads into the console's config and its mistakes
// are refused by their key: no sign-in, both kinds, plain http to a host
// other than localhost, a proxy address that is not one, the console on
// the ops listener's address.
func TestConsoleBlockLoadsAndItsMistakesNameTheKey(t *testing.T) {
	const ok = "console:\n  listen: 127.0.0.1:9470\n  base_url: https://intake.example.com\n  auth:\n    proxy: {header: X-Forwarded-User, from: [10.0.0.5, 10.1.0.0/16]}\n    reviewers: [alice@example.com]\n"
	f, err := Parse([]byte(example(t) + ok))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Console.Enabled() || f.Console.Auth.Proxy.Header != "X-Forwarded-User" || f.Console.Auth.Reviewers[0] != "alice@example.com" {
		t.Errorf("console block: got %+v", f.Console)
	}
	for _, c := range []struct{ block, want string }{
		{"console:\n  listen: 127.0.0.1:9470\n  base_url: https://intake.example.com\n", "console.auth: exactly one of oidc or proxy"},
		{"console:\n  listen: 127.0.0.1:9470\n  base_url: http://intake.example.com\n  auth: {proxy: {header: X-U, from: [10.0.0.5]}}\n", "console.base_url"},
		{"console:\n  listen: 127.0.0.1:9470\n  base_url: https://i.example.com\n  auth: {proxy: {header: X-U, from: [nowhere]}}\n", "console.auth.proxy.from"},
		{"console:\n  listen: 127.0.0.1:9470\n  base_url: https://i.example.com\n  auth: {proxy: {header: X-U, from: [10.0.0.5]}, oidc: {issuer: https://id.example.com, client_id: c}}\n", "exactly one of oidc or proxy"},
		{"console:\n  listen: 127.0.0.1:9464\n  base_url: https://i.example.com\n  auth: {proxy: {header: X-U, from: [10.0.0.5]}}\n", "console.listen"},
		{"console:\n  listen: 127.0.0.1:9470\n  bse_url: https://i.example.com\n", "bse_url"},
	} {
		_, err := Parse([]byte(example(t) + c.block))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error naming %s", c.block, err, c.want)
		}
	}
}
