package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake/notify"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// notify dead lists a dead delivery by its endpoint's id and that
// endpoint's URL in the config (shown without its path), or "(not in the
// config)" for an id the config does not know; redeliver --url selects
// the configured endpoints with that URL (whole, or as listed) and
// revives their deliveries only, and refuses a URL or id no configured
// webhook has.
func TestNotifyDeadAndRedeliverSpeakOfConfiguredEndpoints(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "hookops")
	cfg := writeConfig(t, site, "")
	const hookURL = "https://hooks.example.com/intake/T0K3N"
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hooks := "notify:\n  - {url: \"" + hookURL + "\", secret_env: INTAKE_TEST_HOOK, events: [failed]}\n"
	if err := os.WriteFile(cfg, append([]byte(hooks), b...), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ev int64
	if err := pool.QueryRow(ctx, `INSERT INTO intake_outbox (partner_id, event, payload, fanned_out) VALUES ('hookops', 'failed', '{}', true) RETURNING event_id`).Scan(&ev); err != nil {
		t.Fatal(err)
	}
	configured := partners.DerivedNotifyID(hookURL)
	if _, err := pool.Exec(ctx, `INSERT INTO intake_outbox_delivery (event_id, endpoint_id, state, attempts, dead_at, last_error)
		VALUES ($1, $2, 'dead', 9, now(), 'receiver answered 503'), ($1, 'evil', 'dead', 1, now(), 'endpoint "evil" is not in the config')`, ev, configured); err != nil {
		t.Fatal(err)
	}
	code, out := runCLI("notify", "dead", "--config", cfg)
	if code != 0 {
		t.Fatalf("notify dead: exit %d\n%s", code, out)
	}
	shown := notify.ShownURL(hookURL)
	var hookLine, evilLine string
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(l, configured):
			hookLine = l
		case strings.Contains(l, "evil"):
			evilLine = l
		}
	}
	if !strings.Contains(hookLine, shown) || strings.Contains(out, "T0K3N") {
		t.Fatalf("the configured endpoint's line %q: want %s, never its path\n%s", hookLine, shown, out)
	}
	if !strings.Contains(evilLine, "(not in the config)") || !strings.Contains(evilLine, "is not in the config") {
		t.Fatalf("the forged delivery's line %q: want it shown as not in the config, with its reason\n%s", evilLine, out)
	}
	for _, bad := range [][]string{{"--url", "https://elsewhere.example/x"}, {"--endpoint", "evil"}} {
		args := append([]string{"notify", "redeliver", "--config", cfg, "--all", "--reason", "retry"}, bad...)
		if code, out := runCLI(args...); code != 1 || !strings.Contains(out, "no webhook in the config matches") {
			t.Fatalf("redeliver %v: exit %d %s", bad, code, out)
		}
	}
	if code, out := runCLI("notify", "redeliver", "--config", cfg, "--all", "--url", shown, "--reason", "receiver fixed", "--actor", "ops"); code != 0 || !strings.Contains(out, "1 deliveries sent again") {
		t.Fatalf("redeliver --url as listed: exit %d %s", code, out)
	}
	if st := testenv.Strings(t, pool, `SELECT endpoint_id || ':' || state FROM intake_outbox_delivery WHERE event_id = $1 ORDER BY endpoint_id = 'evil'`, ev); len(st) != 2 || st[0] != configured+":pending" || st[1] != "evil:dead" {
		t.Fatalf("after redeliver --url: %v", st)
	}
}
