package intake_test

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/reason"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

func TestMetricsMoveAsFilesFlow(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "obs")
	r := newRig(t, pool, "w1", site)
	m := r.d.Metrics()
	site.Drop(t, "orders-m1.csv", header+"M-1,a@b.io,1.00,paid,2026-11-01T00:00:00Z,1\nM-2,bad,1.00,paid,2026-11-01T00:00:00Z,1\nM-3,c@d.io,1.00,paid,2026-11-01T00:00:00Z,1\n")
	r.poll("obs")
	if got := testutil.ToFloat64(m.Rows.WithLabelValues("obs", "applied")); got != 2 {
		t.Fatalf("rows applied = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Rows.WithLabelValues("obs", "rejected")); got != 1 {
		t.Fatalf("rows rejected = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Bytes.WithLabelValues("obs")); got <= 0 {
		t.Fatal("bytes downloaded did not move")
	}
	// one series per stage: download, plan, apply, archive
	if n := testutil.CollectAndCount(m.Stage, "intake_stage_duration_seconds"); n != 4 {
		t.Fatalf("stage histogram has %d series, want 4", n)
	}
	// a conflicting resend: the open quarantine shows in the gauges
	site.Drop(t, "orders-m1.csv", header+"M-1,a@b.io,9.00,paid,2026-11-01T00:00:00Z,1\n")
	r.poll("obs")
	if err := r.d.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Files.WithLabelValues("obs", "quarantined")); got != 1 {
		t.Fatalf("quarantined files = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Files.WithLabelValues("obs", "applying")); got != 0 {
		t.Fatalf("applying files = %v, want 0", got)
	}
	if got := testutil.ToFloat64(m.FilesFinished.WithLabelValues("obs", "quarantined")); got != 1 {
		t.Fatalf("finished quarantined = %v", got)
	}
	if got := testutil.ToFloat64(m.PartnerUp.WithLabelValues("obs")); got != 1 {
		t.Fatal("partner not up")
	}
}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// No cell value of a partner's file may appear in logs, in what intake
// writes back (receipts, rejects reports, quarantine reasons) or in metric
// labels: only line numbers, column names and reason codes.
func TestNoCellValueLeaksIntoLogsReportsOrMetrics(t *testing.T) {
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "leak")
	const secret = "S3CRET"
	content := header +
		"L-1,s3cret-ok@example.com,1.00,paid,2026-11-01T00:00:00Z,1\n" +
		"L-2," + secret + "-not-an-email,1.00,paid,2026-11-01T00:00:00Z,1\n" + // rejected: bad email
		"L-3,x@example.com," + secret + ",paid,2026-11-01T00:00:00Z,1\n" + // rejected: not a decimal
		"L-4,x@example.com,1.00," + secret + ",2026-11-01T00:00:00Z,1\n" + // rejected: enum
		"L-5,x@example.com,1.00,paid," + secret + ",1\n" + // rejected: timestamp
		"L-6,x@example.com,1.00,paid,2026-11-01T00:00:00Z," + secret + "\n" + // rejected: integer
		"=" + secret + ",x@example.com,1.00,paid,2026-11-01T00:00:00Z\n" // rejected: ragged, formula
	site.Drop(t, "orders-leak.csv", content)
	// a second file that fails as a whole, its header carrying the secret
	site.Drop(t, "orders-leak2.csv", "order_id,"+secret+",amount,status,placed_at,qty\nL-9,x@example.com,1.00,paid,2026-11-01T00:00:00Z,1\n")
	site.Config.Feeds[0].MaxRejectRatio = 1
	// a third file the database fails with a message quoting the value
	if _, err := pool.Exec(context.Background(), `CREATE FUNCTION quote_it() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.order_id = 'L-T' THEN RAISE EXCEPTION 'refused %', NEW.email; END IF; RETURN NEW; END $$;
		CREATE TRIGGER quote_it BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION quote_it()`); err != nil {
		t.Fatal(err)
	}
	site.Drop(t, "orders-leak3.csv", header+"L-T,"+secret+"@example.com,1.00,paid,2026-11-01T00:00:00Z,1\n")

	var logs syncBuffer
	sp, _ := spool.New(t.TempDir())
	reg := prometheus.NewRegistry()
	cfg := site.Validated(t)
	d, err := intake.New(intake.Config{WorkerID: "w1", Lease: 30 * time.Second, SpoolMinFree: 1}, []partners.Config{cfg}, pool, sp, reg,
		slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	if err := d.PollOnce(context.Background(), "leak"); err != nil {
		t.Fatal(err)
	}
	got := testenv.Files(t, pool, "leak")
	if len(got) != 3 || got[0].Rejected != 6 || got[1].State != "failed_terminal" || got[2].Reason != string(reason.TargetError) {
		t.Fatalf("got %+v", got)
	}
	if !strings.Contains(logs.String(), "intake_id") {
		t.Fatal("no log lines captured")
	}
	for _, where := range []struct{ name, text string }{{"logs", logs.String()}} {
		if strings.Contains(strings.ToUpper(where.text), secret) {
			t.Fatalf("a cell value appears in %s:\n%s", where.name, where.text)
		}
	}
	for _, dir := range []string{"reports", "quarantine"} {
		filepath.WalkDir(filepath.Join(site.Root, dir), func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || (dir == "quarantine" && !strings.HasSuffix(p, ".reason.json")) {
				return nil
			}
			b, _ := os.ReadFile(p)
			if strings.Contains(strings.ToUpper(string(b)), secret) {
				t.Fatalf("a cell value appears in %s:\n%s", p, b)
			}
			return nil
		})
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(strings.ToUpper(l.GetValue()), secret) || strings.Contains(l.GetValue(), "orders-leak") {
					t.Fatalf("metric %s has label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}
