package sftpconn_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A reply on either channel counts as the keepalive's proof of life (a
// session polled more often than its keepalive interval sends none); a
// request alone does not.
func TestARepliedRequestStandsInForAKeepalive(t *testing.T) {
	p := partner(t)
	s, err := sftpconn.Dial(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := time.Now()
	if sftpconn.HeardSince(s, before) {
		t.Fatal("heard from the site before anything was asked")
	}
	if _, err := s.Stat(s.Layout.ReadyDir()); err != nil {
		t.Fatal(err)
	}
	if !sftpconn.HeardSince(s, before) {
		t.Fatal("a STAT's reply did not count")
	}
	mid := time.Now()
	if err := s.ListDir(context.Background(), s.Layout.ReadyDir(), func(_ os.FileInfo) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if !sftpconn.HeardSince(s, mid) {
		t.Fatal("a listing's reply did not count")
	}
}
