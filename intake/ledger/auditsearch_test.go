package ledger_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The audit page's text search (the review console's) finds the text
// anywhere in the actor, action, reason, detail, partner or database
// user, case ignored, and the intake id; it takes % and _ literally, and
// never shows a partner outside the ones asked for.
func TestTheAuditSearchTakesItsTextLiterally(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	for _, r := range []struct {
		actor, action, partner, reason string
		intake                         int64
	}{
		{"alice", "release", "p1", "fixed 50% of the rows", 0},
		{"bob", "discard", "p1", "fixed 50 rows", 77},
		{"carol", "approve", "p1", "plan a_b looked right", 0},
		{"dave", "approve", "p2", "50% again, another partner", 0},
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO intake_audit (actor, action, partner_id, reason, intake_id)
			VALUES ($1, $2, $3, $4, nullif($5, 0))`, r.actor, r.action, r.partner, r.reason, r.intake); err != nil {
			t.Fatal(err)
		}
	}
	l := ledger.New(pool, time.Minute)
	for _, c := range []struct {
		text string
		want []string
	}{
		{"50%", []string{"alice"}},
		{"_", []string{"carol"}},
		{"ALICE", []string{"alice"}},
		{"77", []string{"bob"}},
		{"approve", []string{"carol"}},
		{"p1", []string{"carol", "bob", "alice"}},
		{"", []string{"carol", "bob", "alice"}},
		{`\`, nil},
	} {
		es, err := l.AuditPage(ctx, []string{"p1"}, ledger.AuditFilter{Text: c.text}, 0, 10)
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		var got []string
		for _, e := range es {
			got = append(got, e.Actor)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("search %q: %v, want %v", c.text, got, c.want)
		}
	}
}
