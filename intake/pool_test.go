package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// The daemon's sessions ask the server to probe their TCP connection
// after 30 s of silence, three times 10 s apart: a client gone with its
// host (power, a partition) is noticed in about a minute rather than the
// kernel's two hours, and what its session held (a COPY's row lock that
// a restarted worker's Resume waits for, the reconciler's leader lock)
// is let go.
func TestTheDaemonsSessionsNoticeAGoneClientWithinAMinute(t *testing.T) {
	url, _ := testenv.DB(t)
	pc, err := intake.PoolConfig(url, "w1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for name, want := range map[string]string{"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10", "tcp_keepalives_count": "3"} {
		var got string
		if err := pool.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
