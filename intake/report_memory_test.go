package intake_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/fault"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// An update_only file of 300,000 rows whose keys the target lacks: every
// row is rejected not_found, and the rejects report (one line per row) is
// streamed from the ledger through a spool file to the site. The live heap
// (after a GC, sampled without pause while the report is written) never
// grows by more than 8 MiB over what it was right before: a report built
// in memory holds its 300,000 lines and grew it by 12 MiB; streamed, it
// grows by 0.4-4.5 MiB (the SFTP writes in flight, the ledger's rows
// being read, more of both on a loaded machine).
func TestARejectsReportOf300kNotFoundRowsKeepsTheHeapFlat(t *testing.T) {
	const rows = 300_000
	const maxGrowth = 8 << 20
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "rjmem")
	site.Config.Feeds[0].Mode = partners.ModeUpdateOnly
	r := newRig(t, pool, "rjmem-w", site)
	site.Drop(t, "orders-1.csv", testenv.OrdersCSV("R", rows))

	// the poll stops right before the file's reports are written
	if err := fault.Set("archive:mid=pause"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fault.Set("") })
	t.Cleanup(func() { fault.Resume("archive:mid") })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		done <- r.d.PollOnce(ctx, "rjmem")
	}()
	select {
	case <-fault.Paused("archive:mid"):
	case err := <-done:
		t.Fatalf("the poll ended before the file's archive: %v", err)
	}

	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := live()
	stop, sampled := make(chan struct{}), make(chan uint64)
	go func() {
		peak := uint64(0)
		for {
			select {
			case <-stop:
				sampled <- peak
				return
			default:
				peak = max(peak, live())
			}
		}
	}()
	fault.Resume("archive:mid")
	err := <-done
	close(stop)
	peak := <-sampled
	if err != nil {
		t.Fatal(err)
	}

	f := files(t, pool, "rjmem")[0]
	if f.State != "archived" || f.Rejected != rows || f.Applied != 0 || f.Rejects == "" {
		t.Fatalf("file %+v, want archived with %d rows rejected and a rejects report", f, rows)
	}
	rel, err := filepath.Rel(site.Root, f.Rejects)
	if err != nil {
		t.Fatal(err)
	}
	rf, err := os.Open(filepath.Join(site.Root, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	lines, notFound := 0, 0
	for sc := bufio.NewScanner(rf); sc.Scan(); lines++ {
		if lines > 0 && len(sc.Bytes()) > 0 && strings.Contains(sc.Text(), ",not_found,") {
			notFound++
		}
	}
	if lines != rows+1 || notFound != rows {
		t.Fatalf("rejects report: %d lines, %d not_found, want a header and %d not_found rows", lines, notFound, rows)
	}
	growth := int64(peak) - int64(base)
	t.Logf("live heap before the reports %d KiB, peak while they were written %d KiB (growth %d KiB)", base>>10, peak>>10, growth>>10)
	if growth > maxGrowth {
		t.Fatalf("the live heap grew by %d KiB while the rejects report was written, want at most %d KiB", growth>>10, maxGrowth>>10)
	}
}
