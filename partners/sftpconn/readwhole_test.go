package sftpconn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A small file is read whole on the listing channel (its FSTAT, READs and
// CLOSE sent together once the OPEN is answered): an empty file, one that
// takes one READ and one that takes three come back byte for byte; a
// file longer than the limit comes back cut at the limit; a missing file
// is a not-exist error, after which the channel goes on.
func TestReadWholeReturnsTheFileUpToItsLimit(t *testing.T) {
	p := partner(t)
	s := dialed(t, p)
	const limit = 70000 // three READs of at most 32 KiB
	for _, n := range []int{0, 300, 32 << 10, 65536, limit, limit + 5000} {
		body := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		name := fmt.Sprintf("small-%d", n)
		if err := os.WriteFile(filepath.Join(p.SFTP.Root, "ready", name), body, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := s.ReadWhole(s.Layout.Ready(name), limit)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if want := body[:min(n, limit)]; !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: read %d bytes, want the first %d", n, len(got), len(want))
		}
	}
	if _, err := s.ReadWhole(s.Layout.Ready("missing"), limit); !sftpconn.IsNotExist(err) {
		t.Fatalf("a missing file: %v, want not-exist", err)
	}
	if _, err := s.ReadDir(s.Layout.ReadyDir()); err != nil {
		t.Fatalf("listing after a refused OPEN: %v", err)
	}
}

// A site that answers READs with fewer bytes than asked (SFTP allows it)
// is never taken at its first reply: ReadWhole says the replies do not add
// up to the file, and ReadManifest reads the manifest through pkg/sftp
// instead, whole. A manifest over its limit is refused either way.
func TestAShortReadingSiteStillGivesTheWholeManifest(t *testing.T) {
	root := t.TempDir()
	srv, p := inProcessSite(t, root)
	srv.ShortReads(100)
	s := dialed(t, p)
	man := fmt.Sprintf(`{"bytes": 12, "sha256": %q, "batch_id": %q}`, strings.Repeat("ab", 32), strings.Repeat("b", 200))
	if err := os.WriteFile(filepath.Join(root, "m.complete"), []byte(man), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadWhole("/m.complete", 64<<10); !errors.Is(err, sftpconn.ErrPartRead) {
		t.Fatalf("ReadWhole of %d bytes over 100-byte reads: %v, want a part read", len(man), err)
	}
	m, err := s.ReadManifest("/m.complete")
	if err != nil {
		t.Fatal(err)
	}
	if m.Bytes != 12 || m.BatchID != strings.Repeat("b", 200) {
		t.Fatalf("manifest %+v", m)
	}
	srv.ShortReads(0)
	if m, err := s.ReadManifest("/m.complete"); err != nil || m.BatchID != strings.Repeat("b", 200) {
		t.Fatalf("manifest on the listing channel: %+v, %v", m, err)
	}
	big := `{"bytes": 12, "sha256": "` + strings.Repeat("ab", 32) + `"}` + strings.Repeat(" ", 64<<10)
	if err := os.WriteFile(filepath.Join(root, "big.complete"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, short := range []int{0, 1000} {
		srv.ShortReads(short)
		if _, err := s.ReadManifest("/big.complete"); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("a manifest over its limit (reads of %d): %v", short, err)
		}
	}
}

// ReadManifest tells the partner's fault from the site's: a manifest that
// does not parse is ErrManifestInvalid (the file is held for it), a
// missing one is not-exist, and a read the session could not make (here a
// closed session) is neither, so the file's next attempt reads it again.
func TestReadManifestTellsABadManifestFromAFailedRead(t *testing.T) {
	root := t.TempDir()
	_, p := inProcessSite(t, root)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bad.complete"), []byte(`{"bytes": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadManifest("/bad.complete"); !errors.Is(err, partners.ErrManifestInvalid) {
		t.Fatalf("a manifest without sha256: %v, want ErrManifestInvalid", err)
	}
	if _, err := s.ReadManifest("/missing.complete"); !sftpconn.IsNotExist(err) || errors.Is(err, partners.ErrManifestInvalid) {
		t.Fatalf("a missing manifest: %v, want not-exist", err)
	}
	s.Close()
	_, err = s.ReadManifest("/bad.complete")
	if err == nil || errors.Is(err, partners.ErrManifestInvalid) || sftpconn.IsNotExist(err) || sftpconn.IsPermission(err) {
		t.Fatalf("a read on a closed session: %v, want an error of the read itself", err)
	}
}
