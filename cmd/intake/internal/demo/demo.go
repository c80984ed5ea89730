// Package demo is `intake demo`: a throwaway PostgreSQL from the system's
// binaries, an in-process SFTP drop site with a generated (and pinned) host
// key, two example partners with example files covering every outcome, and
// the real daemon processing them.
package demo

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/partner-intake/partner-intake/intake"
	"github.com/partner-intake/partner-intake/intake/ledger"
	"github.com/partner-intake/partner-intake/internal/keygen"
	"github.com/partner-intake/partner-intake/internal/pgerr"
	"github.com/partner-intake/partner-intake/internal/pgtemp"
	"github.com/partner-intake/partner-intake/internal/sftpd"
	"github.com/partner-intake/partner-intake/migrations"
	"github.com/partner-intake/partner-intake/partners"
	"github.com/partner-intake/partner-intake/spool"
)

// Options of a demo run.
type Options struct {
	// Once exits after the example files are summarised.
	Once bool
	Out  io.Writer
	Log  io.Writer
}

// Run runs the demo until ctx ends (or, with Once, until the examples are done).
func Run(ctx context.Context, o Options) error {
	out := o.Out
	dir, err := os.MkdirTemp("", "intake-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintln(out, "== starting a throwaway PostgreSQL from the system's binaries")
	pg, err := pgtemp.Start(pgtemp.Options{})
	if err != nil {
		return err
	}
	defer pg.Close()
	url, err := pg.CreateDB(ctx, "intake_demo")
	if err != nil {
		return err
	}
	if _, err := migrations.Up(url); err != nil {
		return err
	}
	pc, err := intake.PoolConfig(url, "demo-1", 30*time.Second)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, demoDDL); err != nil {
		return fmt.Errorf("create demo tables: %w", err)
	}

	fmt.Fprintln(out, "== starting the partners' SFTP drop site (in-process, generated host key, pinned)")
	site, err := newSite(dir)
	if err != nil {
		return err
	}
	defer site.srv.Close()

	sp, err := spool.New(filepath.Join(dir, "spool"))
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(o.Log, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: pgerr.ReplaceAttr}))
	d, err := intake.New(intake.Config{WorkerID: "demo-1", Lease: 30 * time.Second, Drain: 5 * time.Second, SpoolMinFree: 16 << 20},
		site.partners, pool, sp, prometheus.NewRegistry(), logger)
	if err != nil {
		return err
	}
	w1, w2 := wave1(), wave2()
	if err := site.drop(w1); err != nil {
		return err
	}
	fmt.Fprintf(out, "== dropped %d example files; running the daemon (worker demo-1)\n", dataFiles(w1))
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer d.Stop()
	bar := progressBar(out)
	if err := waitFinished(ctx, pool, dataFiles(w1), bar); err != nil {
		return err
	}
	if err := site.drop(w2); err != nil {
		return err
	}
	fmt.Fprintf(out, "== dropped %d more: an exact resend, a conflicting resend, a replay under a new batch id\n", dataFiles(w2))
	total := dataFiles(w1) + dataFiles(w2)
	if err := waitFinished(ctx, pool, total, bar); err != nil {
		return err
	}
	last, err := summary(ctx, out, pool, site, 0)
	if err != nil {
		return err
	}
	if o.Once {
		return checkOutcomes(ctx, pool)
	}
	site.instructions(out)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\n== stopping; cleaning up")
			return nil
		case <-t.C:
			if last, err = summary(ctx, out, pool, site, last); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// site is the drop site of the demo's partners.
type site struct {
	dir      string
	srv      *sftpd.Server
	roots    map[string]string
	partners []partners.Config
	keys     map[string]string
	known    string
}

func newSite(dir string) (*site, error) {
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	host, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		return nil, err
	}
	s := &site{dir: dir, roots: map[string]string{}, keys: map[string]string{}}
	var users []sftpd.User
	for _, id := range []string{"acme", "globex"} {
		root := filepath.Join(dir, "sites", id)
		for _, sub := range []string{"incoming", "ready"} {
			if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
				return nil, err
			}
		}
		keyFile := filepath.Join(dir, "keys", id)
		pub, err := keygen.Write(keyFile)
		if err != nil {
			return nil, err
		}
		s.roots[id], s.keys[id] = root, keyFile
		users = append(users, sftpd.User{Name: id, Key: pub, Root: root})
	}
	s.srv, err = sftpd.Start("127.0.0.1:0", host, users, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	s.known = filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(s.known, []byte(knownhosts.Line([]string{s.srv.Addr()}, host.PublicKey())+"\n"), 0o600); err != nil {
		return nil, err
	}
	for _, id := range []string{"acme", "globex"} {
		p := partners.Config{
			ID:   id,
			SFTP: partners.SFTP{Address: s.srv.Addr(), User: id, PrivateKeyFile: s.keys[id], KnownHostsFile: s.known, Root: "/"},
			Poll: "@every 2s",
		}
		if id == "acme" {
			p.Feeds = []partners.Feed{ordersFeed()}
		} else {
			p.Readiness = partners.ReadinessManifest
			p.Feeds = []partners.Feed{inventoryFeed()}
		}
		p.SetDefaults()
		if err := p.Validate("demo." + id); err != nil {
			return nil, err
		}
		s.partners = append(s.partners, p)
	}
	return s, nil
}

// drop publishes files as a partner should: upload as .part, then rename.
// Manifests go last, after their data file.
func (s *site) drop(fs []file) error {
	for pass := 0; pass < 2; pass++ {
		for _, f := range fs {
			if strings.HasSuffix(f.name, ".complete") != (pass == 1) {
				continue
			}
			root := s.roots[f.partner]
			part := filepath.Join(root, "incoming", f.name+".part")
			if err := os.WriteFile(part, []byte(f.content), 0o644); err != nil {
				return err
			}
			if err := os.Rename(part, filepath.Join(root, "ready", f.name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *site) instructions(out io.Writer) {
	_, port, _ := strings.Cut(s.srv.Addr(), ":")
	fmt.Fprintf(out, `
== the daemon keeps running. Drop more files with the stock sftp client, e.g. as partner acme:

  sftp -i %s -o UserKnownHostsFile=%s -P %s acme@127.0.0.1
  sftp> put my-orders.csv incoming/orders-20261201.csv.part
  sftp> rename incoming/orders-20261201.csv.part ready/orders-20261201.csv
  sftp> ls reports

acme's feed "orders": files named orders-*.csv, comma-separated, header
order_id,email,amount,status,placed_at (status: new|paid|shipped; placed_at RFC 3339).
globex (manifest mode): stock-*.csv plus stock-*.csv.complete {"bytes","sha256","batch_id","rows"}.
Outcomes appear below as files finish. Ctrl-C stops the demo and removes everything it made.
`, s.keys["acme"], s.known, port)
}

// progressBar draws files finished and rows committed on a terminal; it
// draws nothing when out is not one.
func progressBar(out io.Writer) func(done, total int, rowsDone, rows int64) {
	f, ok := out.(*os.File)
	if st, err := os.Stdout.Stat(); !ok || f != os.Stdout || err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func(int, int, int64, int64) {}
	}
	return func(done, total int, rowsDone, rows int64) {
		const width = 30
		fill := width * done / max(total, 1)
		fmt.Fprintf(out, "\r   [%s%s] %d/%d files", strings.Repeat("#", fill), strings.Repeat("-", width-fill), done, total)
		if rows > 0 {
			fmt.Fprintf(out, ", applying %d/%d rows", rowsDone, rows)
		}
		if done >= total {
			fmt.Fprint(out, "\r\033[K")
		}
	}
}

func waitFinished(ctx context.Context, pool *pgxpool.Pool, n int, bar func(int, int, int64, int64)) error {
	deadline := time.Now().Add(2 * time.Minute)
	l := ledger.New(pool, 0)
	for {
		done, rowsDone, rows, err := l.Progress(ctx)
		if err != nil {
			return err
		}
		bar(done, n, rowsDone, rows)
		if done >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d files finished within 2 minutes", done, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// summary prints the files finished after intake id `after` and returns
// the highest id printed.
func summary(ctx context.Context, out io.Writer, pool *pgxpool.Pool, s *site, after int64) (int64, error) {
	files, err := ledger.New(pool, 0).Finished(ctx, after)
	if err != nil {
		return after, err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for i, f := range files {
		if i == 0 {
			fmt.Fprintln(out)
			fmt.Fprintln(tw, "INTAKE\tPARTNER\tFILE\tOUTCOME\tROWS total/applied/unchanged/rejected/conflict\tEVIDENCE\tRECEIPT")
		}
		outcome := string(f.State)
		if f.Reason != "" && string(f.Reason) != outcome {
			outcome += " (" + string(f.Reason) + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d/%d/%d/%d/%d\t%s\t%s\n", f.ID, f.Partner, f.RemoteName, outcome,
			f.RowsTotal, f.RowsApplied, f.RowsUnchanged, f.RowsRejected, f.RowsConflict,
			strings.TrimPrefix(f.ArchivePath, "/"), strings.TrimPrefix(f.ReceiptPath, "/"))
		after = f.ID
	}
	tw.Flush()
	if len(files) > 0 {
		fmt.Fprintf(out, "(paths are on each partner's site: %s/<partner>/)\n", filepath.Join(s.dir, "sites"))
	}
	return after, nil
}

// checkOutcomes verifies the examples ended as designed, so `demo --once`
// fails loudly if the pipeline regresses.
func checkOutcomes(ctx context.Context, pool *pgxpool.Pool) error {
	want := map[string]int{"archived": 4, "duplicate": 1, "quarantined": 2, "failed_terminal": 1}
	files, err := ledger.New(pool, 0).Finished(ctx, 0)
	if err != nil {
		return err
	}
	got := map[string]int{}
	for _, f := range files {
		got[string(f.State)]++
	}
	for s, n := range want {
		if got[s] != n {
			return errors.New(fmt.Sprintf("demo outcomes: got %v, want %v", got, want))
		}
	}
	return nil
}
