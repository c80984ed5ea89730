package intake_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// A large file is read over two SFTP channels of the session, its ranges
// on whichever channel is free (each channel has its own SSH window): the
// second channel opens the file and joins the read, the bytes reach the
// spool in order, hashed once, and its rows apply exactly once.
func TestLargeFileIsReadOverTwoChannels(t *testing.T) {
	defer intake.SetTwoChannels(1<<20, 0)()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "two")
	data := testenv.OrdersCSV("TC", 90000) // about 5.5 MB: three ranges and a short one
	site.Drop(t, "orders-big.csv", data)
	r := newRig(t, pool, "w1", site)
	before := intake.TwoChannelReads()
	r.poll("two")
	// the second channel joins the read once it has the file open, which
	// on a near site may come after the last byte: the count waits for it
	waitUntil(t, func() bool { return intake.TwoChannelReads()-before == 1 })
	fs := files(t, pool, "two")
	if len(fs) != 1 {
		t.Fatalf("%d intake rows, want 1", len(fs))
	}
	f := fs[0]
	if f.State != "archived" || f.Total != 90000 || f.Applied != 90000 {
		t.Fatalf("%+v, want archived with 90000 rows applied", f)
	}
	sum := sha256.Sum256([]byte(data))
	if rc := receipt(t, site, f.Receipt); rc.SHA256 != hex.EncodeToString(sum[:]) || rc.Bytes != int64(len(data)) {
		t.Fatalf("receipt says sha256 %s, %d bytes; the file is %x, %d bytes", rc.SHA256, rc.Bytes, sum, len(data))
	}
	testenv.AssertExactOrders(t, pool, "two", 90000, "TC")
}

// A near site (round trip under intake's threshold) is read on one
// channel whatever the file's size: one channel's window is no limit
// there, and a second sftp-server would only cost the site.
func TestNearSiteIsReadOnOneChannel(t *testing.T) {
	defer intake.SetTwoChannels(1<<20, time.Hour)()
	_, pool := testenv.DB(t)
	site := testenv.NewSite(t, "one")
	site.Drop(t, "orders-big.csv", testenv.OrdersCSV("OC", 30000))
	r := newRig(t, pool, "w1", site)
	before := intake.TwoChannelReads()
	r.poll("one")
	if got := intake.TwoChannelReads() - before; got != 0 {
		t.Fatalf("%d downloads read over two channels from a near site, want 0", got)
	}
	if f := files(t, pool, "one")[0]; f.State != "archived" || f.Applied != 30000 {
		t.Fatalf("%+v, want archived with 30000 rows", f)
	}
}
