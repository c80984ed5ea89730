package intake

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/intake/target"
	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
)

// A COPY stream whose run was dropped as it opened (its context ended
// before the COPY took its binary header) is closed by openStream and
// not handed back: the apply ahead, abandoning, closes what it holds,
// and a second close of the same stream waited for the COPY's end that
// the first had taken, for ever (a forged file held while its apply
// ahead opened its stream hung its poll). A stream closed again returns
// what its first close did.
func TestACopyStreamIsClosedOnce(t *testing.T) {
	_, pool := testenv.DB(t)
	ctx := context.Background()
	mustExec(t, pool, `CREATE TABLE stream_t (partner_id text NOT NULL, k integer NOT NULL, v text,
		last_intake_id bigint NOT NULL, UNIQUE (partner_id, k))`)
	tgt, err := target.Load(ctx, pool, &partners.Feed{Name: "stream_t", Target: "stream_t", Key: []string{"k"},
		Columns: []partners.Column{{Name: "k", Type: partners.TypeInteger}, {Name: "v", Type: partners.TypeText}}})
	if err != nil {
		t.Fatal(err)
	}
	if !tgt.Binary() {
		t.Fatal("stream_t is not written in COPY's binary format: the header is not written")
	}
	withTx := func(f func(tx pgx.Tx)) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		f(tx)
	}

	withTx(func(tx pgx.Tx) {
		dropped, cancel := context.WithCancel(ctx)
		cancel()
		s, err := openStream(dropped, tx, tgt)
		if err == nil || s != nil {
			t.Fatalf("a stream opened in a dropped run: %v, %v; want no stream and its error", s != nil, err)
		}
	})
	withTx(func(tx pgx.Tx) {
		s, err := openStream(ctx, tx, tgt)
		if err != nil {
			t.Fatal(err)
		}
		first := s.close(false)
		if first == nil {
			t.Fatal("a stream closed as failed returned no error")
		}
		if again := s.close(false); again != first {
			t.Fatalf("closed again: %v, want %v", again, first)
		}
	})
}
