package testenv

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/internal/keygen"
	"github.com/partner-intake/partner-intake/internal/syspkg"
	"github.com/partner-intake/partner-intake/partners"
)

// Partners run SFTP servers that nobody here wrote. Each constructor below
// starts one such server from its Debian package for one test (stopped with
// the test) and returns a *Site like NewSite's, so one test can run over
// every server (Servers).

// Server names, as Site.Server and the subtests of a test over Servers
// spell them.
const (
	ServerOpenSSH      = "openssh"
	ServerProFTPD      = "proftpd"
	ServerRcloneLocal  = "rclone-local"
	ServerRcloneMemory = "rclone-memory"
)

// Server is a kind of partner server an interop test runs against.
type Server struct {
	Name    string                              // ServerOpenSSH, ...
	NewSite func(t testing.TB, id string) *Site // a fresh site on a server of this kind
}

// Servers lists the partner servers an interop test runs against.
func Servers() []Server {
	return []Server{
		{ServerOpenSSH, NewSite},
		{ServerProFTPD, NewProFTPDSite},
		{ServerRcloneLocal, func(t testing.TB, id string) *Site { return NewRcloneSite(t, id, RcloneLocal) }},
		{ServerRcloneMemory, func(t testing.TB, id string) *Site { return NewRcloneSite(t, id, RcloneMemory) }},
	}
}

// NewProFTPDSite makes a partner whose site is a fresh directory served by
// ProFTPD's mod_sftp (Debian's proftpd-core with proftpd-mod-crypto), run
// in the foreground (-n) on a random loopback port with a configuration of
// its own: a virtual account whose home is the site directory, chrooted
// there (DefaultRoot ~), so the partner's root is "/". mod_sftp reads the
// authorized client key in RFC 4716 form.
func NewProFTPDSite(t testing.TB, id string) *Site {
	t.Helper()
	bin, err := syspkg.Find([]string{"/usr/sbin/proftpd"}, "proftpd-core", "proftpd-mod-crypto")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := syspkg.Find([]string{"/usr/lib/proftpd/mod_sftp.so"}, "proftpd-mod-crypto"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "site")
	mkSiteDirs(t, root)
	hostKey, hostPub := writeECDSAHostKey(t, filepath.Join(dir, "host_ecdsa"))
	clientKey := filepath.Join(dir, "client_ed25519")
	clientPub, err := keygen.Write(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), rfc4716(clientPub), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil {
		t.Fatal(err)
	}
	// the account intake logs in as: the tests' own uid, so the site's
	// files stay readable by the test
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(fmt.Sprintf("partner:*:%s:%s::%s:/bin/sh\n", u.Uid, u.Gid, root)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "group"), []byte(fmt.Sprintf("partner:*:%s:\n", u.Gid)), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(port int) string {
		return strings.Join([]string{
			"ModulePath /usr/lib/proftpd",
			"LoadModule mod_sftp.c",
			"ServerType standalone",
			`ServerName "intake-test"`,
			"DefaultAddress 127.0.0.1",
			"UseIPv6 off",
			fmt.Sprintf("Port %d", port),
			"User " + u.Username,
			"Group " + g.Name,
			"RootLogin on", // the tests run as root on CI; the account is the tests' uid
			"WtmpLog off",
			"UseReverseDNS off",
			"PidFile " + filepath.Join(dir, "proftpd.pid"),
			"ScoreboardFile " + filepath.Join(dir, "scoreboard"),
			"DelayTable none",
			"SystemLog " + filepath.Join(dir, "system.log"),
			"AuthOrder mod_auth_file.c",
			"AuthUserFile " + filepath.Join(dir, "passwd"),
			"AuthGroupFile " + filepath.Join(dir, "group"),
			"RequireValidShell off",
			"DefaultRoot ~",
			"Umask 022",
			"AllowOverwrite on",
			"MaxInstances 100",
			"SFTPEngine on",
			"SFTPLog " + filepath.Join(dir, "sftp.log"),
			"SFTPHostKey " + hostKey,
			"SFTPAuthMethods publickey",
			"SFTPAuthorizedUserKeys file:" + filepath.Join(dir, "authorized_keys"),
		}, "\n") + "\n"
	}
	addr := startServer(t, dir, "proftpd", func(port int) (*exec.Cmd, error) {
		cf := filepath.Join(dir, "proftpd.conf")
		if err := os.WriteFile(cf, []byte(conf(port)), 0o600); err != nil {
			return nil, err
		}
		return exec.Command(bin, "-n", "-q", "-c", cf), nil
	})
	kh := writeKnownHosts(t, dir, addr, hostPub)
	return &Site{Root: root, Server: ServerProFTPD, Config: partners.Config{
		ID: id,
		SFTP: partners.SFTP{Address: addr, User: "partner", PrivateKeyFile: clientKey, KnownHostsFile: kh,
			Root: "/", DialTimeout: 10 * time.Second},
		Feeds: []partners.Feed{OrdersFeed()},
	}}
}

// RcloneBackend is what rclone serve sftp serves.
type RcloneBackend int

const (
	// RcloneLocal serves a local directory (rclone's local backend through
	// its VFS: RENAME replaces an existing target).
	RcloneLocal RcloneBackend = iota
	// RcloneMemory serves rclone's in-memory object store (:memory:): a
	// bucket-like store, nothing on this machine's disk.
	RcloneMemory
)

// NewRcloneSite makes a partner whose site is served by rclone serve sftp
// (Debian's rclone) on a random loopback port, with a host key of its own
// (--key) and the client key authorized (--authorized-keys). Drop, Files
// and Read reach the site through SFTP, as the partner does (over
// RcloneMemory the site has no directory here: Root is "").
func NewRcloneSite(t testing.TB, id string, backend RcloneBackend) *Site {
	t.Helper()
	bin, err := syspkg.Find([]string{"/usr/bin/rclone"}, "rclone")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hostKey := filepath.Join(dir, "host_ed25519")
	hostPub, err := keygen.Write(hostKey)
	if err != nil {
		t.Fatal(err)
	}
	clientKey := filepath.Join(dir, "client_ed25519")
	clientPub, err := keygen.Write(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), ssh.MarshalAuthorizedKey(clientPub), 0o600); err != nil {
		t.Fatal(err)
	}
	var root, remote, name string
	switch backend {
	case RcloneLocal:
		root = filepath.Join(dir, "site")
		mkSiteDirs(t, root)
		remote, name = root, ServerRcloneLocal
	case RcloneMemory:
		remote, name = ":memory:", ServerRcloneMemory
	default:
		t.Fatalf("rclone backend %d", backend)
	}
	addr := startServer(t, dir, "rclone", func(port int) (*exec.Cmd, error) {
		return exec.Command(bin, "serve", "sftp", remote,
			"--config", filepath.Join(dir, "rclone.conf"), // none: no remote of the machine's is read
			"--addr", fmt.Sprintf("127.0.0.1:%d", port),
			"--key", hostKey,
			"--authorized-keys", filepath.Join(dir, "authorized_keys"),
			"--log-level", "NOTICE"), nil
	})
	kh := writeKnownHosts(t, dir, addr, hostPub)
	s := &Site{Root: root, Server: name, Config: partners.Config{
		ID: id,
		SFTP: partners.SFTP{Address: addr, User: "partner", PrivateKeyFile: clientKey, KnownHostsFile: kh,
			Root: "/", DialTimeout: 10 * time.Second},
		Feeds: []partners.Feed{OrdersFeed()},
	}}
	// rclone's VFS caches directory listings (--dir-cache-time): a file
	// written into the served directory behind its back is not listed
	// for minutes. The partner uploads through SFTP, as it would.
	s.remote = dialSFTP(t, s.Config.SFTP)
	for _, d := range []string{"incoming", "ready"} {
		if err := s.remote.MkdirAll("/" + d); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func mkSiteDirs(t testing.TB, root string) {
	t.Helper()
	for _, d := range []string{"incoming", "ready"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// startServer starts the command start makes for a free loopback port
// (found by listening on port 0 and closing: another process may take it
// before the server does, so a server that does not come up is started
// again on another port), waits until it answers with an SSH banner, and
// stops it (its whole process group: ProFTPD forks a process per login)
// when the test ends. Its output goes to dir/<name>.log, shown when it
// fails to start.
func startServer(t testing.TB, dir, name string, start func(port int) (*exec.Cmd, error)) string {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 4; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd, err := start(port)
		if err != nil {
			t.Fatal(err)
		}
		logPath := filepath.Join(dir, name+".log")
		logf, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			logf.Close()
			t.Fatalf("start %s: %v", name, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(exited) }()
		stop := func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if lastErr = awaitBanner(addr, exited); lastErr == nil {
			t.Cleanup(stop)
			return addr
		}
		stop()
		out, _ := os.ReadFile(logPath)
		lastErr = fmt.Errorf("%w\n%s", lastErr, out)
	}
	t.Fatalf("%s did not start: %v", name, lastErr)
	return ""
}

// awaitBanner waits until addr answers with an SSH identification line,
// or the server exits, or 20 seconds pass.
func awaitBanner(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("the server exited")
		case <-tick.C:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err == nil && strings.HasPrefix(line, "SSH-") {
			return nil
		}
	}
	return fmt.Errorf("no SSH banner on %s", addr)
}

// writeECDSAHostKey writes a P-256 host key in PEM (SEC 1) form, which
// every server here reads, mode 0600 (mod_sftp refuses a key others can
// read), and returns its path and public key.
func writeECDSAHostKey(t testing.TB, path string) (string, ssh.PublicKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return path, pub
}

// rfc4716 is pub in the SSH2 public key file format (RFC 4716) that
// mod_sftp's SFTPAuthorizedUserKeys reads: base64 of the wire form in
// lines of at most 72 characters between the BEGIN and END markers.
func rfc4716(pub ssh.PublicKey) []byte {
	b64 := base64.StdEncoding.EncodeToString(pub.Marshal())
	var sb strings.Builder
	sb.WriteString("---- BEGIN SSH2 PUBLIC KEY ----\n")
	for len(b64) > 70 {
		sb.WriteString(b64[:70] + "\n")
		b64 = b64[70:]
	}
	sb.WriteString(b64 + "\n---- END SSH2 PUBLIC KEY ----\n")
	return []byte(sb.String())
}

func writeKnownHosts(t testing.TB, dir, addr string, pub ssh.PublicKey) string {
	t.Helper()
	kh := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(kh, []byte(knownhosts.Line([]string{addr}, pub)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return kh
}

// dialSFTP opens an SFTP client of the test's own on the site (the partner's
// side of it, for a site with no directory here), closed with the test.
func dialSFTP(t testing.TB, c partners.SFTP) *sftp.Client {
	t.Helper()
	key, err := os.ReadFile(c.PrivateKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	hk, err := knownhosts.New(c.KnownHostsFile)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ssh.Dial("tcp", c.Address, &ssh.ClientConfig{User: c.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hk, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sftp.NewClient(conn)
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close(); conn.Close() })
	return cl
}

// remotePath is rel (slash-separated, relative to the site's root) as a
// path on the site's server.
func (s *Site) remotePath(rel string) string {
	return strings.TrimSuffix(s.Config.SFTP.Root, "/") + "/" + strings.TrimPrefix(filepath.ToSlash(rel), "/")
}

// Rel is a path the server gave (a receipt's, a rejects report's) relative
// to the site's root, as Read and Files take it.
func (s *Site) Rel(t testing.TB, remote string) string {
	t.Helper()
	root := strings.TrimSuffix(s.Config.SFTP.Root, "/") + "/"
	if !strings.HasPrefix(remote, root) {
		t.Fatalf("%s is not below the site's root %s", remote, root)
	}
	return strings.TrimPrefix(remote, root)
}

func (s *Site) dropRemote(t testing.TB, name, content string) {
	t.Helper()
	part := s.remotePath("incoming/" + name + ".part")
	f, err := s.remote.Create(part)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(content)); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.remote.Rename(part, s.remotePath("ready/"+name)); err != nil {
		t.Fatal(err)
	}
}

func (s *Site) filesRemote(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	base := s.remotePath(dir)
	w := s.remote.Walk(base)
	for w.Step() {
		if w.Err() != nil || !w.Stat().Mode().IsRegular() {
			continue
		}
		out = append(out, strings.TrimPrefix(strings.TrimPrefix(w.Path(), base), "/"))
	}
	return out
}

func (s *Site) readRemote(t testing.TB, rel string) string {
	t.Helper()
	f, err := s.remote.Open(s.remotePath(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sb strings.Builder
	if _, err := f.WriteTo(&sb); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}
