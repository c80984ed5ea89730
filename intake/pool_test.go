package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
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

// The worker id lock's session (ledger/workerlock.go) is let go by the
// server only when a silent client stayed silent for at least a lease and
// 30 s: keepalives 30 s, then 3 probes lease/3 apart, a user timeout that
// does not cut them short, and no idle or statement timeout.
func TestTheWorkerIDLocksSessionOutlastsALease(t *testing.T) {
	url, _ := testenv.DB(t)
	pc, err := intake.PoolConfig(url, "w1", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, ledger.WorkerLockConnConfig(pc.ConnConfig, "w1", 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for name, want := range map[string]string{"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "40", "tcp_keepalives_count": "3",
		"tcp_user_timeout": "150000", "idle_session_timeout": "0", "statement_timeout": "0", "application_name": "partner-intake/w1"} {
		var got string
		if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
