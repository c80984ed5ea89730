package sitefile_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A large file is written through pkg/sftp with as many WRITEs in flight
// as the site's round trip needs (sftpconn's writesInFlight), and
// arrives whole under its name, with no temporary file left.
func TestALargeFileIsWrittenWhole(t *testing.T) {
	site := testenv.NewSite(t, "acme")
	cfg := site.Validated(t)
	s, err := sftpconn.Dial(context.Background(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prepare("w1", true); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20+12345) // over WholeMax: pkg/sftp's path
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	p, err := sitefile.PutFrom(s, s.Layout.ReportsDir(), "big.rejects.csv", bytes.NewReader(data), int64(len(data)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := site.Read(t, site.Rel(t, p)); got != string(data) {
		t.Fatalf("the site holds %d bytes, not the %d written", len(got), len(data))
	}
	if got := site.Files(t, "reports"); len(got) != 1 {
		t.Fatalf("reports/ holds %v, want the one file", got)
	}
}
