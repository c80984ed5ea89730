package sshdtest

import (
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func dialT(t *testing.T, s *Server, opts ...sftp.ClientOption) *sftp.Client {
	b, _ := os.ReadFile(s.ClientKeyFile)
	signer, _ := ssh.ParsePrivateKey(b)
	hk, _ := knownhosts.New(s.KnownHostsFile)
	conn, _ := net.Dial("tcp", s.Addr)
	c, chans, reqs, err := ssh.NewClientConn(conn, s.Addr, &ssh.ClientConfig{User: s.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hk})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := sftp.NewClient(ssh.NewClient(c, chans, reqs), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestDLTiming(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	root, _ := s.PartnerRoot("x")
	p := filepath.Join(root, "big")
	buf := make([]byte, 96<<20)
	rand.Read(buf)
	os.WriteFile(p, buf, 0o644)
	for _, pk := range []int{32 << 10, 128 << 10, 255 << 10, 255 << 10} {
		sc := dialT(t, s, sftp.MaxPacketUnchecked(pk), sftp.UseConcurrentReads(true), sftp.MaxConcurrentRequestsPerFile(64))
		for i := 0; i < 2; i++ {
			t0 := time.Now()
			f, _ := sc.Open(p)
			out, _ := os.Create(filepath.Join(t.TempDir(), "o"))
			h := sha256.New()
			n, err := f.WriteTo(io.MultiWriter(h, out))
			out.Sync()
			out.Close()
			f.Close()
			t.Logf("pk %d one stream: %d bytes %v err %v", pk, n, time.Since(t0), err)
		}
		sc.Close()
	}
	a := dialT(t, s)
	b := dialT(t, s)
	t0 := time.Now()
	var wg sync.WaitGroup
	half := int64(len(buf) / 2)
	for i, c := range []*sftp.Client{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, _ := c.Open(p)
			f.Seek(int64(i)*half, 0)
			io.Copy(io.Discard, io.LimitReader(f, half))
			f.Close()
		}()
	}
	wg.Wait()
	t.Logf("two streams: %v", time.Since(t0))
}
