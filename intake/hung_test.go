package intake_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/intake/ops"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/reconcile"
	"github.com/partner-intake/partner-intake/spool"
)

// behindProxy routes a site through a TCP proxy (its host key pinned for
// the proxy's address).
func behindProxy(t *testing.T, site *testenv.Site) *testenv.Proxy {
	t.Helper()
	proxy := testenv.NewProxy(t, site.Config.SFTP.Address)
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{proxy.Addr()}, testenv.SSHD().HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	site.Config.SFTP.Address, site.Config.SFTP.KnownHostsFile = proxy.Addr(), kh
	return proxy
}

// A partner's site hangs (the TCP connection stays open,
// nothing comes back). The partner's poll fails with a deadline error
// instead of waiting for good, the other partner's files land meanwhile
// through the same daemon, the reconciler and the purge finish every other
// partner and report the hung one, and the hung partner recovers by
// itself when its site answers again.
func TestHungSiteHoldsUpNoOtherPartner(t *testing.T) {
	_, pool := testenv.DB(t)
	hung := testenv.NewSite(t, "hung")
	good := testenv.NewSite(t, "good")
	proxy := behindProxy(t, hung)
	hung.Config.SFTP.OpTimeout = time.Second
	hung.Config.SFTP.DialTimeout = 2 * time.Second
	// Keepalives would also notice a dead peer, after two intervals; far
	// off here, so only the per-request deadline can end a hung call.
	hung.Config.SFTP.Keepalive = time.Hour
	hung.Config.Poll, good.Config.Poll = "@every 1s", "@every 1s"
	r := newRig(t, pool, "w1", hung, good)
	polled := &intake.Signals(r.d).Polled
	polled.Init(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.d.Stop()
	archived := func(partner string) int64 {
		return testenv.Count(t, pool, `SELECT count(*) FROM file_intake WHERE partner_id = $1 AND state = 'archived'`, partner)
	}
	hung.Drop(t, "orders-h1.csv", testenv.OrdersCSV("H", 3))
	good.Drop(t, "orders-g1.csv", testenv.OrdersCSV("G", 3))
	waitUntil(t, func() bool { return archived("hung") == 1 && archived("good") == 1 })

	// The hung partner's session is open; from now on its site says nothing.
	proxy.Freeze()
	frozenAt := time.Now()
	hung.Drop(t, "orders-h2.csv", testenv.OrdersCSV("I", 3))
	for _, n := range []string{"orders-g2.csv", "orders-g3.csv", "orders-g4.csv"} {
		good.Drop(t, n, testenv.OrdersCSV(strings.ToUpper(n[8:10]), 3))
	}
	waitUntil(t, func() bool { return archived("good") == 4 })

	// A poll of the hung partner ends with a deadline error: the open
	// session's first request, or the dial of a new one.
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	err := r.d.PollOnce(pctx, "hung")
	pcancel()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("poll of the hung partner: got %v, want a deadline error (os.ErrDeadlineExceeded)", err)
	}
	// The daemon's own polls of it failed the same way (recorded for
	// `intake status`), on the per-request deadline or the dial's.
	var lastErr string
	var lastErrAt time.Time
	if err := pool.QueryRow(ctx, `SELECT coalesce(last_error, ''), coalesce(last_error_at, 'epoch')
		FROM intake_partner_poll WHERE partner_id = 'hung'`).Scan(&lastErr, &lastErrAt); err != nil {
		t.Fatal(err)
	}
	if lastErrAt.Before(frozenAt) || !regexp.MustCompile(`sftp\.(op|dial)_timeout`).MatchString(lastErr) {
		t.Fatalf("last recorded poll error of the hung partner: %q at %v, want a deadline error after %v", lastErr, lastErrAt, frozenAt)
	}
	if n := archived("hung"); n != 1 {
		t.Fatalf("%d files of the hung partner archived, want 1", n)
	}

	// The reconciler works every partner and reports the hung one.
	hungCfg, goodCfg := hung.Validated(t), good.Validated(t)
	stale := filepath.Join(good.Root, "incoming", "orders-g9.csv.part")
	if err := os.WriteFile(stale, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reconcile.New(reconcile.Config{PartnerTimeout: 20 * time.Second}, "rec", 30*time.Second, pool, sp,
		[]partners.Config{hungCfg, goodCfg}, prometheus.NewRegistry(), testenv.Logger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Stop()
	fs, err := rec.RunOnce(ctx)
	if err != nil && !strings.Contains(err.Error(), "partner hung") {
		t.Fatalf("reconcile: %v", err)
	}
	kinds := map[string]bool{}
	for _, f := range fs {
		kinds[f.Partner+"/"+f.Kind] = true
	}
	if !kinds["good/"+ledger.KindStaleUpload] {
		t.Fatalf("the reconciler did not finish the good partner: %+v", fs)
	}
	if !kinds["hung/"+ledger.KindPartnerDown] && !kinds["hung/"+ledger.KindPartnerFailed] {
		t.Fatalf("the reconciler says nothing of the hung partner: %+v", fs)
	}

	// The purge does the good partner and reports the hung one.
	res, err := ops.Purge(ctx, pool, sp, []partners.Config{hungCfg, goodCfg},
		ops.Retention{Reports: time.Hour, PartnerTimeout: 20 * time.Second}, time.Now().Add(48*time.Hour))
	if err == nil || !strings.Contains(err.Error(), "partner hung") {
		t.Fatalf("purge: got %v, want an error for the hung partner", err)
	}
	got := map[string]ops.Purged{}
	for _, p := range res {
		got[p.Partner] = p
	}
	if got["hung"].Err == nil || got["good"].Err != nil || got["good"].Reports != 4 {
		t.Fatalf("purge: got %+v, want the hung partner failed and the good one's 4 receipts removed", res)
	}

	// The site answers again: the partner recovers by itself.
	polled.Clear()
	proxy.Thaw()
	waitUntil(t, func() bool { return archived("hung") == 2 })
	if st := r.d.PartnerStates()["hung"]; !st.Up {
		polled.WaitFor(func(p intake.PollDone) bool { return p.Partner == "hung" && p.Err == nil })
		if st := r.d.PartnerStates()["hung"]; !st.Up {
			t.Fatalf("the hung partner polled fine after its site answered again, and is not up: %+v", st)
		}
	}
}
