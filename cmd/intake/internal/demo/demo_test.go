package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The demo is the product's main job: it must run end to end and show
// every outcome class.
func TestDemoShowsEveryOutcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, log bytes.Buffer
	if err := Run(ctx, Options{Once: true, Out: &out, Log: &log}); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), log.String())
	}
	for _, w := range []string{"archived", "duplicate", "quarantined (batch_conflict)", "quarantined (manifest_mismatch)",
		"failed_terminal (header_mismatch)", "25/0/25/0/0", "6/4/0/2/0", "receipt.json"} {
		if !strings.Contains(out.String(), w) {
			t.Fatalf("demo output lacks %q:\n%s", w, out.String())
		}
	}
}
