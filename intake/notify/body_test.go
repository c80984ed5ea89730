package notify_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/notify"
)

// With the review console served (console.base_url), a webhook event
// about a file carries that file's page in the console; an event about
// no file (a late window) carries none, and without a console no event
// does.
func TestAFilesEventCarriesItsConsolePage(t *testing.T) {
	file := ledger.Delivery{EventID: 7, EndpointID: "ops", Partner: "acme", Event: "quarantined",
		Payload: []byte(`{"intake_id": 42, "feed": "orders", "state": "quarantined"}`), CreatedAt: time.Unix(0, 0)}
	late := ledger.Delivery{EventID: 8, EndpointID: "ops", Partner: "acme", Event: "late",
		Payload: []byte(`{"feed": "orders", "scheduled_at": "2026-12-04T06:00:00Z"}`), CreatedAt: time.Unix(0, 0)}
	page := func(b []byte) string {
		var v struct {
			ConsoleURL *string `json:"console_url"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		if v.ConsoleURL == nil {
			return "(none)"
		}
		return *v.ConsoleURL
	}
	for _, c := range []struct {
		d       ledger.Delivery
		console string
		want    string
	}{
		{file, "https://intake.example.com/", "https://intake.example.com/files/42"},
		{file, "https://intake.example.com", "https://intake.example.com/files/42"},
		{late, "https://intake.example.com", "(none)"},
		{file, "", "(none)"},
	} {
		if got := page(notify.Body(c.d, c.console)); got != c.want {
			t.Errorf("event %s with console %q: console_url %s, want %s", c.d.Event, c.console, got, c.want)
		}
	}
}
