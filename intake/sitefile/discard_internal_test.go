package sitefile

import (
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/intake/ledger"
)

// A discard's receipt says what stays: nothing of a file that applied
// nothing, the rows a file that failed part way put in place (before
// ops released it for another run, too), and for
// ops' replay of a file, that the replayed intake's rows stand: it is no
// file the partner must send again.
func TestADiscardSaysWhatStays(t *testing.T) {
	for _, c := range []struct {
		name string
		in   ledger.Intake
		want string
		not  string
	}{
		{"a file that applied nothing", ledger.Intake{}, "nothing of it was applied", "replay"},
		{"a file that failed part way", ledger.Intake{RowsApplied: 3}, "3 of its rows", "nothing of it"},
		{"a file held again after its release, before a chunk", ledger.Intake{RowsAppliedEarlier: 4}, "4 of its rows, applied by its runs before ops released it, stay", "nothing of it"},
		{"a file held again after its release, part way", ledger.Intake{RowsUnchanged: 2, RowsAppliedEarlier: 4}, "2 of its rows were in the target before it was held (applied by it, or already there) and stay (rows.applied, rows.unchanged, rows.deleted); 4 rows its runs applied before ops released it stand as well", "nothing of it"},
		{"a replay", ledger.Intake{ReplayOf: 29}, "held replay of intake 29 was closed; nothing of the replay", "Send a corrected file"},
		{"a replay held part way", ledger.Intake{ReplayOf: 29, RowsApplied: 5}, "5 rows the replay applied before it was held stay", "Send a corrected file"},
		{"a replay held again after its release", ledger.Intake{ReplayOf: 29, RowsAppliedEarlier: 3}, "nothing of the replay was applied since ops released it; 3 rows its runs applied before ops released it stand (rows.applied_before_release)", "Send a corrected file"},
	} {
		got := discardDetail(&c.in)
		if !strings.Contains(got, c.want) || strings.Contains(got, c.not) {
			t.Errorf("%s: %q; want %q in it and not %q", c.name, got, c.want, c.not)
		}
	}
}
