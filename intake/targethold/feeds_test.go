package targethold

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/intake/target"
)

func TestFeedsHoldRenewAndRelease(t *testing.T) {
	var f Feeds
	if c, _ := f.Set("orders", ""); c != Unchanged || f.Any() {
		t.Fatalf("letting go a feed not held: %v, any %v", c, f.Any())
	}
	if c, _ := f.Set("orders", "no unique index"); c != Holds || !f.Any() || !f.Held("orders") || f.Held("stock") {
		t.Fatalf("hold: %v, any %v", c, f.Any())
	}
	if held, due := f.Due("orders"); !held || due {
		t.Fatalf("just held: held %v due %v, want held and not due before Retry", held, due)
	}
	if c, _ := f.Set("orders", "no table"); c != Unchanged || f.Problems()["orders"] != "no table" {
		t.Fatalf("held again: %v, problems %v", c, f.Problems())
	}
	f.AllDue()
	if _, due := f.Due("orders"); !due {
		t.Fatal("AllDue: not due")
	}
	f.Later("orders")
	if _, due := f.Due("orders"); due {
		t.Fatal("Later: still due")
	}
	c, since := f.Set("orders", "")
	if c != Released || since.IsZero() || time.Since(since) > time.Minute || f.Any() || f.Problems() != nil {
		t.Fatalf("release: %v since %v, any %v", c, since, f.Any())
	}
}

func TestUnusableIsTheTablesFaultNotTheConnections(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&target.Error{}, true},
		{fmt.Errorf("load: %w", &pgconn.PgError{Code: "42P01"}), true},
		{&pgconn.PgError{Code: "53300"}, false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		if got := Unusable(c.err); got != c.want {
			t.Fatalf("Unusable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
