package chunkrows

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/partner-intake/partner-intake/internal/testenv"
)

// stalledReader gives one line of COPY data, then blocks in Read until
// released.
type stalledReader struct {
	n                int
	inRead, released chan struct{}
}

func (r *stalledReader) Read(p []byte) (int, error) {
	if r.n++; r.n == 1 {
		return copy(p, "x\n"), nil
	}
	close(r.inRead)
	<-r.released
	return 0, io.EOF
}

// Why Rows.DropPayload exists: when the server ends the session in the
// middle of a COPY (a FATAL, as PostgreSQL's shutdown sends), pgconn's
// CopyFrom returns while its goroutine is still reading the payload. Had it
// been reading a chunk's scratch buffer, the chunk's retry would write the
// next payload into a buffer still being read (the data race seen once in
// TestPostgresRestartDuringApply/fast). If this fails, pgconn waits for its
// reader now, and DropPayload can go.
func TestCopyFromReturnsWhileItsPayloadIsStillRead(t *testing.T) {
	url, admin := testenv.DB(t)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `CREATE TABLE copy_sink (x text)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	r := &stalledReader{inRead: make(chan struct{}), released: make(chan struct{})}
	defer close(r.released)
	done := make(chan error, 1)
	go func() {
		_, err := conn.CopyFrom(ctx, r, `COPY copy_sink FROM STDIN`)
		done <- err
	}()
	<-r.inRead
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, conn.PID()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the COPY of a terminated session succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("CopyFrom waited for its payload reader: pgconn changed, Rows.DropPayload is no longer needed")
	}
}
