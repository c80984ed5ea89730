package sftpconn

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pkg/sftp"
)

// RenameAndOpen holds the OPEN behind the RENAME by seeing the RENAME
// passed on to the channel in one write (awaitSent): pkg/sftp writes it
// so. Pinned here, against pkg/sftp's own client and server, so that an
// upgrade that writes it in pieces (claims would quietly cost a round
// trip more) fails a test.
func TestARenameIsPassedOnInOneWrite(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "a.csv"), filepath.Join(dir, "b.csv")
	if err := os.WriteFile(from, []byte("id\n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	srv, err := sftp.NewServer(struct {
		io.Reader
		io.WriteCloser
	}{sr, sw})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	w := newWatchdog(time.Minute)
	c, err := sftp.NewClientPipe(cr, watchedWriter{w: w, wc: cw})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// the pipes first: the client's Close waits for its reader
		sw.Close()
		cw.Close()
		c.Close()
		srv.Close()
	}()
	sent, cancel := w.awaitSent(renamePacket(from, to))
	defer cancel()
	if err := c.Rename(from, to); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sent:
	default:
		t.Fatal("the RENAME was not seen passed on in one write")
	}
	if w.nwait.Load() != 0 {
		t.Fatalf("%d waiters left", w.nwait.Load())
	}
	// another RENAME of other paths is not taken for it
	sent2, cancel2 := w.awaitSent(renamePacket(from, to))
	defer cancel2()
	if err := c.Rename(to, from); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sent2:
		t.Fatal("a RENAME of other paths was taken for the one awaited")
	default:
	}
}
