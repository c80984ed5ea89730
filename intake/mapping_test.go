package intake_test

import (
	"context"
	"testing"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A file part way through its apply when ops change when the feed's files
// are due (expect:) resumes under the same mapping: the change is no part
// of it, so the file neither fails mapping_changed nor plans again. A
// change of the mapping itself (a column) still fails it.
func TestAChangeBesideTheMappingDoesNotFailAFileInFlight(t *testing.T) {
	for _, change := range []string{"expect", "column"} {
		t.Run(change, func(t *testing.T) {
			_, pool := testenv.DB(t)
			site := testenv.NewSite(t, "frozen")
			site.Config.Feeds[0].ChunkRows = 2
			site.Drop(t, "orders-20261101.csv", goodRows("F", 6))
			if err := fault.Set("apply:mid_chunk=error@2"); err != nil {
				t.Fatal(err)
			}
			first := newRig(t, pool, "w1", site)
			if err := first.d.PollOnce(context.Background(), "frozen"); err == nil {
				t.Fatal("the apply went through its second chunk")
			}
			fault.Set("")
			first.d.Stop()
			fs := files(t, pool, "frozen")
			if len(fs) != 1 || fs[0].State != "applying" || fs[0].Chunks != 1 {
				t.Fatalf("rows %+v, want one file applying after its first chunk", fs)
			}

			switch change {
			case "expect":
				site.Config.Feeds[0].Expect = &partners.Expect{Schedule: "0 6 * * *", Timezone: "Europe/Berlin"}
			case "column":
				site.Config.Feeds[0].Columns[len(site.Config.Feeds[0].Columns)-1].MaxLength = 99
			}
			second := newRig(t, pool, "w1", site)
			second.poll("frozen")
			fs = files(t, pool, "frozen")
			switch change {
			case "expect":
				if len(fs) != 1 || fs[0].State != "archived" || fs[0].Applied != 6 || fs[0].Chunks != 3 {
					t.Fatalf("rows %+v, want the file archived with its 6 rows in 3 chunks", fs)
				}
			case "column":
				if len(fs) != 1 || fs[0].State != "failed_terminal" || fs[0].Reason != "mapping_changed" {
					t.Fatalf("rows %+v, want the file failed mapping_changed", fs)
				}
			}
		})
	}
}

// A plan waiting for approval keeps its hash when ops change when the
// feed's files are due: the approval of the hash shown is applied, not
// sent back through plan_changed.
func TestAChangeBesideTheMappingKeepsAWaitingPlan(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	site := testenv.NewSite(t, "wait")
	site.Config.Feeds[0].Approval = &partners.Approval{Always: true}
	r := newRig(t, pool, "w1", site)
	site.Drop(t, "orders-1.csv", goodRows("W", 3))
	r.poll("wait")
	f := files(t, pool, "wait")[0]
	if f.State != "awaiting_approval" {
		t.Fatalf("file %+v, want awaiting_approval", f)
	}
	v, _ := planOf(t, pool, "wait", f.ID)
	if err := approve(ctx, pool, "wait", f.ID, v.Hash); err != nil {
		t.Fatal(err)
	}
	r.d.Stop()
	site.Config.Feeds[0].Expect = &partners.Expect{Schedule: "@daily"}
	r2 := newRig(t, pool, "w1", site)
	r2.poll("wait")
	f = files(t, pool, "wait")[0]
	if f.State != "archived" || f.Applied != 3 {
		t.Fatalf("file %+v, want the approved plan applied", f)
	}
}
