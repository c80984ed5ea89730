package intake_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A partner whose site offers only the SHA-1 key exchange
// (diffie-hellman-group14-sha1): polled by default, the poll fails and
// nothing is claimed; with sftp.legacy_algorithms its file lands, and
// intake_partner_legacy_ssh_algorithms is 1 for it (0 for a partner
// without).
func TestAnSHA1OnlySiteIsPolledOnlyWithLegacyAlgorithms(t *testing.T) {
	_, pool := testenv.DB(t)
	srv, err := sshdtest.StartConfig("KexAlgorithms diffie-hellman-group14-sha1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root, err := srv.PartnerRoot("oldsite")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"incoming", "ready"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := &testenv.Site{Root: root, Config: partners.Config{ID: "oldsite",
		SFTP: partners.SFTP{Address: srv.Addr, User: srv.User, PrivateKeyFile: srv.ClientKeyFile,
			KnownHostsFile: srv.KnownHostsFile, Root: root, DialTimeout: 10 * time.Second},
		Feeds: []partners.Feed{testenv.OrdersFeed()}}}
	modern := testenv.NewSite(t, "modern")
	old.Drop(t, "orders-1.csv", testenv.OrdersCSV("O", 3))

	r := newRig(t, pool, "w1", old, modern)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.PollOnce(ctx, "oldsite"); err == nil {
		t.Fatal("a site offering only a SHA-1 key exchange was polled by default")
	}
	if got := files(t, pool, "oldsite"); len(got) != 0 {
		t.Fatalf("claimed without legacy_algorithms: %+v", got)
	}
	if v := testutil.ToFloat64(r.d.Metrics().LegacySSH.WithLabelValues("oldsite")); v != 0 {
		t.Fatalf("legacy gauge %v without legacy_algorithms", v)
	}
	r.d.Stop()

	old.Config.SFTP.LegacyAlgorithms = true
	r = newRig(t, pool, "w1", old, modern)
	r.poll("oldsite")
	got := files(t, pool, "oldsite")
	if len(got) != 1 || got[0].State != "archived" {
		t.Fatalf("with legacy_algorithms: %+v", got)
	}
	testenv.AssertExactOrders(t, pool, "oldsite", 3, "O")
	m := r.d.Metrics().LegacySSH
	if v := testutil.ToFloat64(m.WithLabelValues("oldsite")); v != 1 {
		t.Fatalf("intake_partner_legacy_ssh_algorithms{partner=oldsite} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.WithLabelValues("modern")); v != 0 {
		t.Fatalf("intake_partner_legacy_ssh_algorithms{partner=modern} = %v, want 0", v)
	}
}
