package demo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/partner-intake/partner-intake/partners"
)

// demoDDL creates the demo's target tables: the operator's tables, with
// partner_id, the feed's key under a unique index, and last_intake_id, in
// public (where an unqualified target resolves; docs/target-tables.md).
const demoDDL = `
CREATE TABLE public.demo_orders (
    partner_id     text          NOT NULL,
    order_id       text          NOT NULL,
    email          text,
    amount         numeric(12,2) NOT NULL,
    status         text          NOT NULL,
    placed_at      timestamptz   NOT NULL,
    last_intake_id bigint        NOT NULL,
    intake_row_hash bigint,
    PRIMARY KEY (partner_id, order_id)
);
CREATE TABLE public.demo_inventory (
    partner_id     text    NOT NULL,
    sku            text    NOT NULL,
    warehouse      text    NOT NULL,
    on_hand        integer NOT NULL,
    counted_on     date    NOT NULL,
    note           text,
    last_intake_id bigint  NOT NULL,
    intake_row_hash bigint,
    PRIMARY KEY (partner_id, sku, warehouse)
);`

func ordersFeed() partners.Feed {
	return partners.Feed{
		Name:    "orders",
		Pattern: `orders-[0-9A-Za-z_-]+\.csv`,
		Columns: []partners.Column{
			{Name: "order_id", Type: partners.TypeText, Required: true, MaxLength: 32},
			{Name: "email", Type: partners.TypeEmail},
			{Name: "amount", Type: partners.TypeDecimal, Scale: 2, Required: true},
			{Name: "status", Type: partners.TypeEnum, Values: []string{"new", "paid", "shipped"}, Required: true},
			{Name: "placed_at", Type: partners.TypeTimestamp, Required: true},
		},
		Key:            []string{"order_id"},
		Target:         "demo_orders",
		MaxRejectRatio: 0.5,
	}
}

func inventoryFeed() partners.Feed {
	return partners.Feed{
		Name:    "inventory",
		Pattern: `stock-[a-z0-9-]+\.csv`,
		BatchID: partners.BatchIDRule{From: partners.BatchFromManifest},
		CSV:     partners.Dialect{Delimiter: ";"},
		Columns: []partners.Column{
			{Name: "sku", Type: partners.TypeText, Required: true, MaxLength: 32},
			{Name: "warehouse", Type: partners.TypeEnum, Values: []string{"ams", "ber", "cph"}, Required: true},
			{Name: "on_hand", Type: partners.TypeInteger, Required: true},
			{Name: "counted_on", Type: partners.TypeDate, Layout: "02.01.2006", Required: true},
			{Name: "note", Type: partners.TypeText, MaxLength: 200},
		},
		Key:    []string{"sku", "warehouse"},
		Target: "demo_inventory",
	}
}

type file struct {
	partner, name, content string
}

const ordersHeader = "order_id,email,amount,status,placed_at\n"

func orders(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(ordersHeader)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%s-%03d,buyer%d@example.com,%d.%02d,%s,2026-11-%02dT09:%02d:00Z\n",
			prefix, i, i, 10+i*7, i*3%100, []string{"new", "paid", "shipped"}[i%3], 1+i%28, i%60)
	}
	return b.String()
}

// wave1 is what partners have dropped before the daemon starts.
func wave1() []file {
	withRejects := ordersHeader +
		"B-001,ann@example.com,12.50,paid,2026-11-02T08:00:00Z\n" +
		"B-002,not-an-email,8.00,new,2026-11-02T08:05:00Z\n" +
		"B-003,bo@example.com,7.999,new,2026-11-02T08:10:00Z\n" +
		"B-004,cy@example.com,19.90,shipped,2026-11-02T08:15:00Z\n" +
		"B-005,di@example.com,3.20,paid,2026-11-02T08:20:00Z\n" +
		"B-006,ed@example.com,44.00,paid,2026-11-02T08:25:00Z\n"
	badHeader := "order,mail,amount,status,placed_at\nC-001,x@example.com,1.00,new,2026-11-03T08:00:00Z\n"
	stockA := "sku;warehouse;on_hand;counted_on;note\nSKU-1;ams;40;30.11.2026;\nSKU-2;ams;0;30.11.2026;reorder\nSKU-1;ber;12;30.11.2026;\nSKU-3;cph;7;29.11.2026;damaged: 1\n"
	stockB := "sku;warehouse;on_hand;counted_on;note\nSKU-9;ams;1;30.11.2026;\n"
	return []file{
		{"acme", "orders-20261101.csv", orders("A", 25)},
		{"acme", "orders-20261102.csv", withRejects},
		{"acme", "orders-20261103.csv", badHeader},
		{"globex", "stock-a.csv", stockA},
		{"globex", "stock-a.csv.complete", manifest(stockA, "stock-2026-11-30", 4)},
		{"globex", "stock-b.csv", stockB},
		{"globex", "stock-b.csv.complete", manifest("not these bytes", "stock-2026-11-30b", 1)},
	}
}

// wave2 is what arrives later: an exact resend, a conflicting resend under
// the same batch id, and the same bytes again under a new batch id.
func wave2() []file {
	changed := strings.Replace(wave1()[1].content, "12.50", "13.50", 1)
	return []file{
		{"acme", "orders-20261101.csv", orders("A", 25)},
		{"acme", "orders-20261102.csv", changed},
		{"acme", "orders-20261101-replay.csv", orders("A", 25)},
	}
}

func manifest(content, batch string, rows int) string {
	h := sha256.Sum256([]byte(content))
	return fmt.Sprintf(`{"bytes": %d, "sha256": %q, "batch_id": %q, "rows": %d}`+"\n", len(content), hex.EncodeToString(h[:]), batch, rows)
}

// dataFiles counts the files that become intake rows (manifests do not).
func dataFiles(fs []file) int {
	n := 0
	for _, f := range fs {
		if !strings.HasSuffix(f.name, ".complete") {
			n++
		}
	}
	return n
}
