package sftpconn_test

import (
	"context"
	"fmt"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/partner-intake/partner-intake/internal/testenv"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/partners/sftpconn"
)

// A session's channels share one SSH connection, and a request pkg/sftp
// writes in two parts (SETSTAT's attributes, OPEN's, WRITE's data) goes
// out in two channel messages. ProFTPD's mod_sftp joins a request's parts
// from whatever channel's message comes next (proftpd/proftpd#1897): a
// listing's request on the other channel in between made it apply a
// SETSTAT with garbled times and then wait for a request of 200 MB that
// never came. Requests from the main channel and the listing channel side
// by side, many times over: each time set is read back as set, each
// listing answers, on every server (OpenSSH's sshd keeps each channel's
// bytes apart, and is sent them as pkg/sftp writes them).
func TestRequestsOfTwoChannelsSideBySideReachTheServerWhole(t *testing.T) {
	sites := map[string]func(t *testing.T) *partners.Config{
		testenv.ServerOpenSSH: partner, // this package's own sshd
	}
	for _, srv := range testenv.Servers() {
		if srv.Name != testenv.ServerOpenSSH {
			sites[srv.Name] = func(t *testing.T) *partners.Config {
				p := srv.NewSite(t, "il").Validated(t)
				return &p
			}
		}
	}
	for name, site := range sites {
		t.Run(name, func(t *testing.T) {
			p := site(t)
			p.SFTP.OpTimeout = 10 * time.Second
			s, err := sftpconn.Dial(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			dir := s.Layout.ReadyDir()
			f := path.Join(dir, "stamped")
			w, err := s.Create(f)
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			const rounds = 300
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			wg.Go(func() {
				for i := range rounds {
					at := time.Unix(1_600_000_000+int64(i), 0)
					if err := s.Chtimes(f, at, at); err != nil {
						errs <- fmt.Errorf("round %d: set the time: %w", i, err)
						return
					}
					fi, err := s.Lstat(f)
					if err != nil {
						errs <- fmt.Errorf("round %d: read the time back: %w", i, err)
						return
					}
					if !fi.ModTime().Equal(at) {
						errs <- fmt.Errorf("round %d: the server kept %v, was sent %v", i, fi.ModTime().UTC(), at.UTC())
						return
					}
				}
			})
			wg.Go(func() {
				for i := range rounds {
					if _, err := s.ReadDir(dir); err != nil {
						errs <- fmt.Errorf("round %d: list: %w", i, err)
						return
					}
				}
			})
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}
