// Package sshdtest starts a real OpenSSH sshd with internal-sftp on a
// random loopback port, with a generated host key and a generated client
// key, for tests and benchmarks that claim protocol behaviour. The login
// user is the user running the tests; each partner gets its own root
// directory below Dir.
package sshdtest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/keygen"
	"github.com/partner-intake/partner-intake/internal/proctree"
	"github.com/partner-intake/partner-intake/internal/syspkg"
)

// Server is a running sshd.
type Server struct {
	Dir            string // temp dir holding keys, config and partner roots
	Addr           string // 127.0.0.1:port
	User           string
	ClientKeyFile  string // private key the partner config uses
	KnownHostsFile string // pins the server's host key
	HostKey        ssh.PublicKey
	cmd            *exec.Cmd
	exited         chan struct{}
	logFile        string
	sftpArgs       string // internal-sftp's flags, e.g. "-R" (read-only)
	maxSessions    int    // channels per connection (sshd's MaxSessions); 0: 50
	extra          []string
}

// Start runs sshd in a new temporary directory.
func Start() (*Server, error) { return StartSFTP("") }

// StartSFTP runs sshd whose internal-sftp takes flags: "-R" (a read-only
// account), "-P rename,posix-rename" (requests refused), see sftp-server(8).
func StartSFTP(flags string) (*Server, error) { return start(flags, 0, nil) }

// StartOneChannel runs sshd that allows one channel per connection
// (MaxSessions 1): a site where intake's second channels are refused.
func StartOneChannel() (*Server, error) { return start("", 1, nil) }

// StartChannels runs sshd that allows n channels per connection
// (MaxSessions n).
func StartChannels(n int) (*Server, error) { return start("", n, nil) }

// StartConfig runs sshd with extra sshd_config lines, e.g. "KexAlgorithms
// diffie-hellman-group14-sha1" (a site that offers only that key
// exchange). They come first in the file: for most keywords sshd takes
// the first value it reads.
func StartConfig(lines ...string) (*Server, error) { return start("", 0, lines) }

func start(flags string, maxSessions int, extra []string) (*Server, error) {
	sshd, err := syspkg.Find([]string{"/usr/sbin/sshd"}, "openssh-server", "openssh-sftp-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "intake-sshd-")
	if err != nil {
		return nil, err
	}
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, User: u.Username, exited: make(chan struct{}), sftpArgs: flags, maxSessions: maxSessions, extra: extra}
	if s.maxSessions == 0 {
		s.maxSessions = 50
	}
	hostPub, err := keygen.Write(filepath.Join(dir, "host_ed25519"))
	if err != nil {
		return nil, err
	}
	s.HostKey = hostPub
	s.ClientKeyFile = filepath.Join(dir, "client_ed25519")
	clientPub, err := keygen.Write(s.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientPub), 0o600); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// privilege separation directory sshd insists on when root
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		if err = s.start(sshd); err == nil {
			return s, nil
		}
		if attempt == 3 {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func (s *Server) start(sshd string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg := strings.Join(append(append([]string(nil), s.extra...),
		fmt.Sprintf("Port %d", port),
		"ListenAddress 127.0.0.1",
		"HostKey "+filepath.Join(s.Dir, "host_ed25519"),
		"PidFile "+filepath.Join(s.Dir, "sshd.pid"),
		"AuthorizedKeysFile "+filepath.Join(s.Dir, "authorized_keys"),
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"UsePAM no",
		"StrictModes no",
		"PermitRootLogin prohibit-password",
		"AllowTcpForwarding no",
		"X11Forwarding no",
		strings.TrimSpace("Subsystem sftp internal-sftp "+s.sftpArgs),
		strings.TrimSpace("ForceCommand internal-sftp "+s.sftpArgs),
		"MaxStartups 100:30:200",
		fmt.Sprintf("MaxSessions %d", s.maxSessions),
		"LogLevel ERROR",
	), "\n") + "\n"
	conf := filepath.Join(s.Dir, "sshd_config")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return err
	}
	s.logFile = filepath.Join(s.Dir, "sshd.log")
	logf, err := os.Create(s.logFile)
	if err != nil {
		return err
	}
	s.cmd = exec.Command(sshd, "-D", "-e", "-f", conf)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("sshdtest: start sshd: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); logf.Close(); close(s.exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.logFile)
			return fmt.Errorf("sshdtest: sshd exited: %s", log)
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil && strings.HasPrefix(line, "SSH-") {
				if err := os.WriteFile(filepath.Join(s.Dir, "known_hosts"), []byte(knownhosts.Line([]string{s.Addr}, s.HostKey)+"\n"), 0o600); err != nil {
					return err
				}
				s.KnownHostsFile = filepath.Join(s.Dir, "known_hosts")
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.cmd.Process.Kill()
	<-s.exited
	return fmt.Errorf("sshdtest: sshd did not answer on %s", s.Addr)
}

// Pid is the listening sshd's process id (its per-connection processes
// are its descendants).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// OpensWaiting counts sshd's processes (its sftp subsystems) asleep in
// open(2) of a FIFO that has no writer (the kernel's wait_for_partner):
// a request that hangs there has arrived, which no reply can show.
func (s *Server) OpensWaiting() int {
	procs, err := proctree.Snapshot()
	if err != nil {
		return 0
	}
	n := 0
	for pid := range procs {
		if !proctree.InTree(procs, pid, s.Pid()) {
			continue
		}
		if w, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid)); err == nil && string(w) == "wait_for_partner" {
			n++
		}
	}
	return n
}

// Connections counts the TCP connections sshd holds open (its side of
// each, as /proc/net/tcp lists them): the logins a client holds, as the
// server sees them.
func (s *Server) Connections() (int, error) {
	_, port, err := net.SplitHostPort(s.Addr)
	if err != nil {
		return 0, err
	}
	want, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || fs[3] != "01" { // ESTABLISHED
			continue
		}
		_, lport, ok := strings.Cut(fs[1], ":")
		if p, err := strconv.ParseUint(lport, 16, 16); ok && err == nil && p == want {
			n++
		}
	}
	return n, sc.Err()
}

// PartnerRoot creates and returns the directory that serves as a
// partner's remote root.
func (s *Server) PartnerRoot(partner string) (string, error) {
	d := filepath.Join(s.Dir, "sites", partner)
	return d, os.MkdirAll(d, 0o755)
}

// Close stops sshd and removes its directory.
func (s *Server) Close() error {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		<-s.exited
	}
	return os.RemoveAll(s.Dir)
}

// WriteKey writes a new ed25519 key (for a test that needs another one,
// e.g. a wrong host key) and returns its public key.
func WriteKey(path string) (ssh.PublicKey, error) { return keygen.Write(path) }
