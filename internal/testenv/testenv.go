// Package testenv is the test harness: one throwaway PostgreSQL and one real
// OpenSSH sshd per test package (started in TestMain, stopped after), a
// fresh migrated database per test, and partner sites on that sshd.
package testenv

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pkg/sftp"
	"go.uber.org/goleak"

	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/pgtemp"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
)

var (
	pg       *pgtemp.Server
	sshd     *sshdtest.Server
	tmplOnce sync.Once
	tmplErr  error
	dbSeq    atomic.Int64
)

// Main starts the servers, runs the package's tests and stops them; then
// it runs each of after (a package's own cleanup, such as binaries its
// tests built).
func Main(m *testing.M, after ...func()) {
	code := run(m)
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	var err error
	pg, err = pgtemp.Start(pgtemp.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv: PostgreSQL:", err)
		return 1
	}
	sshd, err = sshdtest.Start()
	if err != nil {
		pg.Close()
		fmt.Fprintln(os.Stderr, "testenv: sshd:", err)
		return 1
	}
	stop := armHangReport(func() { sshd.Close(); pg.Close() })
	code := m.Run()
	stop()
	sshd.Close()
	pg.Close()
	if code == 0 {
		// every daemon, session and pool a test started must be gone
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "testenv: goroutines leaked:", err)
			return 1
		}
	}
	return code
}

// PG is the package's PostgreSQL server.
func PG() *pgtemp.Server { return pg }

// SSHD is the package's sshd.
func SSHD() *sshdtest.Server { return sshd }

// DB creates a fresh migrated database with the test target tables and
// returns its URL and a pool closed at the end of the test.
func DB(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	tmplOnce.Do(func() {
		var url string
		url, tmplErr = pg.CreateDB(ctx, "intake_template")
		if tmplErr != nil {
			return
		}
		if _, tmplErr = migrations.Up(url); tmplErr != nil {
			return
		}
		var c *pgx.Conn
		if c, tmplErr = pgx.Connect(ctx, url); tmplErr != nil {
			return
		}
		if _, tmplErr = c.Exec(ctx, TargetDDL); tmplErr == nil {
			_, tmplErr = c.Exec(ctx, transitionGuard())
		}
		c.Close(ctx)
	})
	if tmplErr != nil {
		t.Fatalf("template database: %v", tmplErr)
	}
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	c, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE intake_template"); err != nil {
		t.Fatal(err)
	}
	url := pg.URL(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	ClosePoolAtCleanup(t, pool)
	return url, pool
}

// TargetDDL is the target table the test feeds write to.
const TargetDDL = `
CREATE TABLE orders (
    partner_id     text          NOT NULL,
    order_id       text          NOT NULL,
    email          text,
    amount         numeric(12,2) NOT NULL,
    status         text          NOT NULL,
    placed_at      timestamptz   NOT NULL,
    qty            integer,
    last_intake_id bigint        NOT NULL,
    intake_row_hash bigint,
    UNIQUE (partner_id, order_id)
);`

// OrdersFeed is the feed matching TargetDDL.
func OrdersFeed() partners.Feed {
	return partners.Feed{
		Name:    "orders",
		Pattern: `orders-.*\.csv`,
		Columns: []partners.Column{
			{Name: "order_id", Type: partners.TypeText, Required: true, MaxLength: 32},
			{Name: "email", Type: partners.TypeEmail},
			{Name: "amount", Type: partners.TypeDecimal, Scale: 2, Required: true},
			{Name: "status", Type: partners.TypeEnum, Values: []string{"new", "paid", "shipped"}, Required: true},
			{Name: "placed_at", Type: partners.TypeTimestamp, Required: true},
			{Name: "qty", Type: partners.TypeInteger},
		},
		Key:            []string{"order_id"},
		Target:         "orders",
		MaxRejectRatio: 0.5,
	}
}

// Site is a partner's drop site: on the package's sshd (NewSite), or on a
// server of its own (NewInProcessSite, NewProFTPDSite, NewRcloneSite).
type Site struct {
	Root   string // the site's directory on this machine; "" when the server keeps it elsewhere
	Server string // the server's name (ServerOpenSSH, ...)
	Config partners.Config
	// remote, when set, is how Drop, Files and Read reach the site:
	// through SFTP, as the partner does (a server with no directory here,
	// or one that caches what it lists)
	remote *sftp.Client
}

// NewSite makes a partner whose remote root is a fresh directory on sshd.
func NewSite(t testing.TB, id string) *Site {
	t.Helper()
	root, err := sshd.PartnerRoot(fmt.Sprintf("%s-%d", id, dbSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"incoming", "ready"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := partners.Config{
		ID: id,
		SFTP: partners.SFTP{Address: sshd.Addr, User: sshd.User, PrivateKeyFile: sshd.ClientKeyFile,
			KnownHostsFile: sshd.KnownHostsFile, Root: root, DialTimeout: 10 * time.Second},
		Feeds: []partners.Feed{OrdersFeed()},
	}
	return &Site{Root: root, Server: ServerOpenSSH, Config: c}
}

// Validated returns the site's config with defaults, validated.
func (s *Site) Validated(t testing.TB) partners.Config {
	t.Helper()
	c := s.Config
	c.Feeds = append([]partners.Feed(nil), s.Config.Feeds...)
	c.SetDefaults()
	if err := c.Validate("partner"); err != nil {
		t.Fatal(err)
	}
	return c
}

// Drop publishes a file into ready/ the way a partner should: write under
// incoming/ as .part, then rename.
func (s *Site) Drop(t testing.TB, name, content string) {
	t.Helper()
	if s.remote != nil {
		s.dropRemote(t, name, content)
		return
	}
	part := filepath.Join(s.Root, "incoming", name+".part")
	if err := os.WriteFile(part, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(part, filepath.Join(s.Root, "ready", name)); err != nil {
		t.Fatal(err)
	}
}

// Files lists the regular files below dir of the site, relative to it.
func (s *Site) Files(t testing.TB, dir string) []string {
	t.Helper()
	if s.remote != nil {
		return s.filesRemote(t, dir)
	}
	var out []string
	base := filepath.Join(s.Root, dir)
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(base, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// Read returns a file of the site.
func (s *Site) Read(t testing.TB, rel string) string {
	t.Helper()
	if s.remote != nil {
		return s.readRemote(t, rel)
	}
	b, err := os.ReadFile(filepath.Join(s.Root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Logger writes to the test log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: pgerr.ReplaceAttr}))
}

type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
