package sshdtest

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func TestDialTiming(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, _ := os.ReadFile(s.ClientKeyFile)
	signer, _ := ssh.ParsePrivateKey(b)
	hk, _ := knownhosts.New(s.KnownHostsFile)
	for i := 0; i < 4; i++ {
		t0 := time.Now()
		conn, _ := net.Dial("tcp", s.Addr)
		t1 := time.Now()
		c, chans, reqs, err := ssh.NewClientConn(conn, s.Addr, &ssh.ClientConfig{User: s.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hk})
		if err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		cl := ssh.NewClient(c, chans, reqs)
		sc, err := sftp.NewClient(cl)
		if err != nil {
			t.Fatal(err)
		}
		t3 := time.Now()
		t.Logf("tcp %v handshake %v sftp %v", t1.Sub(t0), t2.Sub(t1), t3.Sub(t2))
		sc.Close()
		cl.Close()
	}
	_ = context.Background()
}
