package main

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// `intake run --once` with a feed whose target table does not exist yet:
// the partner's other feed is applied, the held feed's file waits in
// ready/, and the run ends 1 naming the feed (before, it ended 1 before
// polling anyone). Once the table is made, the next run takes the file.
func TestRunOnceWithAFeedItCannotWriteAppliesTheRest(t *testing.T) {
	url, pool := testenv.DB(t)
	t.Setenv("INTAKE_DATABASE_URL", url)
	site := testenv.NewSite(t, "thcli")
	returns := `      - name: returns
        pattern: 'returns-.*\.csv'
        columns:
` + ordersColumnsYAML + `        key: [order_id]
        target: thcli_returns
`
	cfg := writeConfigOpts(t, site, cfgOpts{feedExtra: returns})
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("O", 3))
	site.Drop(t, "returns-1.csv", testenv.OrdersCSV("R", 2))

	code, out := runCLI("run", "--config", cfg, "--once")
	if code != 1 || !strings.Contains(out, "feeds held") || !strings.Contains(out, "target_unusable") || !strings.Contains(out, "thcli/returns") {
		t.Fatalf("run --once with a feed it cannot write: exit %d, want 1 naming the feed\n%s", code, out)
	}
	if fs := testenv.Files(t, pool, "thcli"); len(fs) != 1 || fs[0].Name != "orders-1.csv" || fs[0].State != "archived" {
		t.Fatalf("files %+v, want orders-1.csv archived and nothing of the held feed", fs)
	}
	if got := site.Files(t, "ready"); !reflect.DeepEqual(got, []string{"returns-1.csv"}) {
		t.Fatalf("ready/ holds %v, want the held feed's file", got)
	}

	if _, err := pool.Exec(context.Background(), strings.Replace(testenv.TargetDDL, "TABLE orders", "TABLE thcli_returns", 1)); err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI("run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once once the table exists: exit %d\n%s", code, out)
	}
	if n := testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = 'thcli' AND remote_name = 'returns-1.csv' AND state = 'archived'`); n != 1 {
		t.Fatalf("the held file was not applied once its table exists: %+v", testenv.Files(t, pool, "thcli"))
	}
}
