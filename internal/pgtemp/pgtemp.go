// Package pgtemp starts a throwaway PostgreSQL server from the system's
// binaries in a temporary directory, on a random loopback port. When run as
// root, the server runs as the postgres user (PostgreSQL refuses root).
// The tests and `intake demo` use it; nothing here is mocked.
package pgtemp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/internal/syspkg"
)

// Server is a running throwaway PostgreSQL.
type Server struct {
	Dir  string // everything lives below it
	Port int
	bin  string
	cred *syscall.Credential
}

// Options tune the server.
type Options struct {
	// Durable keeps fsync on (benchmarks); tests turn it off for speed.
	// Either way a commit's WAL is written before the commit returns
	// (synchronous_commit stays on): a server the tests stop with
	// "immediate" (a crash, the machine itself going on) keeps every
	// transaction it said was committed, as a production server does.
	Durable bool
}

// Start initialises and starts a server.
func Start(opts Options) (*Server, error) {
	initdb, err := syspkg.Find([]string{"/usr/lib/postgresql/*/bin/initdb", "/usr/local/bin/initdb", "/usr/bin/initdb"}, "postgresql")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: filepath.Dir(initdb)}
	if _, err := os.Stat(filepath.Join(s.bin, "pg_ctl")); err != nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			s.bin = filepath.Dir(real)
		}
	}
	dir, err := os.MkdirTemp("", "intake-pg-")
	if err != nil {
		return nil, err
	}
	s.Dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtemp: running as root needs the postgres user (apt-get install -y postgresql): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, fmt.Errorf("pgtemp: initdb: %w\n%s", err, out)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = '" + dir + "'",
		"max_connections = 100",
		"shared_buffers = 128MB",
		"log_min_messages = warning",
	}
	if !opts.Durable {
		conf = append(conf, "fsync = off", "full_page_writes = off")
	}
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	f.Close()
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		s.Port, err = freePort()
		if err != nil {
			return nil, err
		}
		if err = s.StartServer(); err == nil {
			return s, s.superuserPath()
		}
		if attempt == 3 {
			return nil, err
		}
	}
}

func (s *Server) data() string { return filepath.Join(s.Dir, "data") }

func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.Dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// StartServer starts (or restarts after StopServer) the server process.
func (s *Server) StartServer() error {
	out, err := s.run("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.Dir, "server.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d", s.Port), "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
		return fmt.Errorf("pgtemp: pg_ctl start: %w\n%s\n%s", err, out, tail(log))
	}
	return nil
}

// StopServer stops the server process, keeping its data (mode: fast or immediate).
func (s *Server) StopServer(mode string) error {
	out, err := s.run("pg_ctl", "-D", s.data(), "-m", mode, "-w", "stop")
	if err != nil {
		return fmt.Errorf("pgtemp: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Close stops the server and removes its directory.
func (s *Server) Close() error {
	err := s.StopServer("immediate")
	os.RemoveAll(s.Dir)
	return err
}

// superuserPath gives the server's superuser a default search_path
// with intake's ledger schema after public: SQL a test or the demo runs
// by hand finds the ledger's tables unqualified and creates its own in
// public. intake's connections set their own path (migrations.SearchPath),
// and the other roles a test makes keep the server's default.
func (s *Server) superuserPath() error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `ALTER ROLE postgres SET search_path = "$user", public, intake`)
	return err
}

// URL is the connection URL of database db.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// CreateDB creates a fresh database and returns its URL.
func (s *Server) CreateDB(ctx context.Context, name string) (string, error) {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte) string {
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// WaitReady waits until the server accepts connections.
func (s *Server) WaitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
