package sitefile_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pkg/sftp"

	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// failing answers a listing or stat with an error of the site's.
type failing struct{}

func (failing) ListAt([]os.FileInfo, int64) (int, error) { return 0, errors.New("the site failed") }

// A takeover's move that the site refuses (another file holds the name at
// its target) while the site also fails the look at its source is not
// taken for done: the file at the target is another's, so the move is
// ErrNotMoved, never "moved, its reply lost".
func TestAMoveNotKnownToHaveLeftItsSourceIsNotMoved(t *testing.T) {
	srv, site := testenv.NewInProcessSite(t, "mv")
	for _, d := range []string{"processing/w1", "processing/w2"} {
		if err := os.MkdirAll(filepath.Join(site.Root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"processing/w1/x.csv", "processing/w2/x.csv"} {
		if err := os.WriteFile(filepath.Join(site.Root, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := site.Validated(t)
	s, err := sftpconn.Dial(context.Background(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	from, to := s.Layout.Processing("w1", "x.csv"), s.Layout.Processing("w2", "x.csv")
	srv.Lie(func(method, p string, truth []os.FileInfo) sftp.ListerAt {
		if method == "Lstat" && p == from {
			return failing{}
		}
		return sftpd.Entries(truth)
	})
	defer srv.Lie(nil)
	if err := sitefile.MoveClaim(s, from, to); !errors.Is(err, sitefile.ErrNotMoved) {
		t.Fatalf("MoveClaim: %v, want ErrNotMoved", err)
	}
}
