package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/partner-intake/partner-intake/intake/sitefile"
	"github.com/partner-intake/partner-intake/internal/testenv"
)

// memLimitKiB is the peak RSS the daemon must stay under whatever one
// hostile file within its configured limits holds.
const memLimitKiB = 128 << 10

// memConfig is a daemon config for one partner with the limits the memory
// tests turn; extra is YAML for the partner's limits block.
func memConfig(t *testing.T, site *testenv.Site, spoolDir, poll, limits string) string {
	t.Helper()
	c := site.Config
	cfg := fmt.Sprintf(`worker_id: mem-1
lease: 2m
drain: 5s
database:
  url_env: INTAKE_DATABASE_URL
spool:
  dir: %s
  min_free_bytes: 1
http:
  listen: 127.0.0.1:0
reconcile:
  schedule: "@every 1h"
partners:
  - id: %s
    poll: "%s"
    concurrency: 1
    sftp:
      address: %s
      user: %s
      private_key_file: %s
      known_hosts_file: %s
      root: %s
    limits:
%s
    feeds:
      - name: orders
        pattern: 'orders-.*\.csv(\.gz)?'
        compression: [gzip]
        columns:
          - {name: order_id, type: text, required: true, max_length: 32}
          - {name: email, type: email}
          - {name: amount, type: decimal, scale: 2, required: true}
          - {name: status, type: enum, values: [new, paid, shipped], required: true}
          - {name: placed_at, type: timestamp, required: true}
          - {name: qty, type: integer}
        key: [order_id]
        target: orders
`, spoolDir, c.ID, poll, c.SFTP.Address, c.SFTP.User, c.SFTP.PrivateKeyFile, c.SFTP.KnownHostsFile, c.SFTP.Root, limits)
	p := filepath.Join(t.TempDir(), "intake.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// vmHWM is the peak resident set of a live process, from /proc.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// publish writes a file into incoming/ with gen, streaming, then renames it
// into ready/ with the given age (older files are claimed first).
func publish(t *testing.T, site *testenv.Site, name string, age time.Duration, gen func(w *bufio.Writer)) {
	t.Helper()
	part := filepath.Join(site.Root, "incoming", name+".part")
	f, err := os.Create(part)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	gen(w)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mt := time.Now().Add(-age)
	if err := os.Chtimes(part, mt, mt); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(part, filepath.Join(site.Root, "ready", name)); err != nil {
		t.Fatal(err)
	}
}

// A 300 MiB file whose second record holds one quoted field of 1 KiB lines
// (no line over the line bound) and a gzip expanding to 4 GiB of zeros:
// the real daemon refuses each with its reason while keeping its peak RSS
// under 128 MiB, and the partner's next good file lands behind them.
func TestHostileFilesKeepThePeakRSSBounded(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "mem")
	spoolDir := t.TempDir()
	cfg := memConfig(t, site, spoolDir, "@every 1s", "      max_expanded_bytes: 67108864")

	const hdr = "order_id,email,amount,status,placed_at,qty\n"
	line := strings.Repeat("y", 1023) + "\n"
	publish(t, site, "orders-a-field.csv", 3*time.Minute, func(w *bufio.Writer) {
		w.WriteString(hdr + "F-1,a@b.io,1.00,new,2026-11-01T00:00:00Z,1\n")
		w.WriteString("F-2,a@b.io,1.00,new,2026-11-01T00:00:00Z,\"")
		for range 300 << 10 { // 300 MiB
			w.WriteString(line)
		}
		w.WriteString("\"\n")
	})
	publish(t, site, "orders-b-bomb.csv.gz", 2*time.Minute, func(w *bufio.Writer) {
		// gzip members concatenated: one member of 8 MiB of zeros
		// written 512 times expands to 4 GiB (Go's reader reads every member)
		var m bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&m, gzip.BestCompression)
		zw.Write(make([]byte, 8<<20))
		zw.Close()
		for range 512 {
			w.Write(m.Bytes())
		}
	})
	publish(t, site, "orders-c-good.csv", time.Minute, func(w *bufio.Writer) {
		w.WriteString(testenv.OrdersCSV("G", 50))
	})

	p, peak := runUntilFinished(t, url, cfg, pool, "mem", 3)
	want := map[string]string{
		"orders-a-field.csv":   "failed_terminal/record_too_large",
		"orders-b-bomb.csv.gz": "quarantined/archive_too_large",
		"orders-c-good.csv":    "archived/",
	}
	fs := testenv.Files(t, pool, "mem")
	for i, f := range fs {
		if got := f.State + "/" + f.Reason; got != want[f.Name] {
			t.Fatalf("%s: %s, want %s", f.Name, got, want[f.Name])
		}
		if i < 2 && f.Applied != 0 {
			t.Fatalf("%s applied %d rows", f.Name, f.Applied)
		}
	}
	if fs[0].Name != "orders-a-field.csv" || fs[2].Name != "orders-c-good.csv" {
		t.Fatalf("claim order: %+v", fs)
	}
	rel, _ := filepath.Rel(site.Root, fs[0].Receipt)
	var rc sitefile.Receipt
	if err := json.Unmarshal([]byte(site.Read(t, rel)), &rc); err != nil || rc.Reason != "record_too_large" || rc.Line != 3 {
		t.Fatalf("receipt %+v (%v), want record_too_large at line 3, where the record starts", rc, err)
	}
	testenv.AssertExactOrders(t, pool, "mem", 50, "G")
	t.Logf("peak RSS of intake run: %d MiB", peak>>10)
	if peak > memLimitKiB {
		t.Fatalf("peak RSS %d KiB, want at most %d KiB", peak, memLimitKiB)
	}
	p.signal(syscall.SIGTERM)
	if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
		t.Fatalf("intake run exited %v", ws)
	}
}

// A ready/ of 100k entries (99,990 no feed matches, older than the ten
// good files): each poll of the real daemon (one at its start; the
// schedule is hourly, and it is started twice) moves exactly half of
// max_files_per_poll of them to quarantine, claims the good files with the
// rest of its budget, and the process's peak RSS (VmHWM) stays under
// 128 MiB. (The exited process's rusage maxrss would not do: Go starts
// children with CLONE_VM, and the kernel carries the parent's high-water
// mark over the exec into the child's maxrss.)
func TestAHundredThousandEntriesInReadyAreBoundedWorkPerPoll(t *testing.T) {
	url, pool := testenv.DB(t)
	site := testenv.NewSite(t, "many")
	cfg := memConfig(t, site, t.TempDir(), "@every 1h", "      max_files_per_poll: 20")
	ready := filepath.Join(site.Root, "ready")
	old := time.Now().Add(-time.Hour)
	const junk, good = 99_990, 10
	for i := range junk {
		p := filepath.Join(ready, fmt.Sprintf("junk-%06d.txt", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 { // a spread of ages; the rest keep their creation time
			os.Chtimes(p, old, old)
		}
	}
	for i := range good {
		site.Drop(t, fmt.Sprintf("orders-g%d.csv", i), testenv.OrdersCSV(fmt.Sprintf("G%d", i), 3))
	}
	quarantined := func() int { return len(site.Files(t, "quarantine")) }
	archived := func() int {
		n := 0
		for _, f := range testenv.Files(t, pool, "many") {
			if strings.HasPrefix(f.Name, "orders-g") && f.State == "archived" {
				n++
			}
		}
		return n
	}
	for poll := 1; poll <= 2; poll++ {
		p := startIntake(t, url, "", "run", "--config", cfg)
		pid := p.cmd.Process.Pid
		var peak int64
		// each hostile entry leaves itself and its reason file in quarantine/
		waitFor(t, 2*time.Minute, func() bool {
			peak = max(peak, vmHWM(t, pid))
			return archived() == good && quarantined() >= poll*10*2
		}, p)
		peak = max(peak, vmHWM(t, pid))
		p.signal(syscall.SIGTERM)
		if ws := p.wait(t, time.Minute); ws.ExitStatus() != 0 {
			t.Fatalf("intake run exited %v:\n%s", ws, tail(p.output()))
		}
		t.Logf("poll %d: peak RSS %d MiB, %d entries in quarantine/", poll, peak>>10, quarantined())
		if peak > memLimitKiB {
			t.Fatalf("poll %d: peak RSS %d KiB, want at most %d KiB", poll, peak, memLimitKiB)
		}
		if n := quarantined(); n != poll*10*2 {
			t.Fatalf("after %d polls %d entries in quarantine/, want %d (10 hostile entries per poll)", poll, n, poll*20)
		}
	}
	testenv.AssertExactOrders(t, pool, "many", 3, "G0", "G1", "G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9")
}

// runUntilFinished runs the real daemon on cfg until the partner's first n
// files have ended (archived, quarantined or failed) and returns the
// daemon, still running, and its peak RSS (VmHWM) sampled all along.
func runUntilFinished(t *testing.T, url, cfg string, pool *pgxpool.Pool, partner string, n int) (*proc, int64) {
	t.Helper()
	p := startIntake(t, url, "", "run", "--config", cfg)
	pid := p.cmd.Process.Pid
	var peak int64
	waitFor(t, 3*time.Minute, func() bool {
		peak = max(peak, vmHWM(t, pid))
		fs := testenv.Files(t, pool, partner)
		if len(fs) < n {
			return false
		}
		for _, f := range fs {
			if f.State != "failed_terminal" && f.State != "quarantined" && f.State != "archived" {
				return false
			}
		}
		return true
	}, p)
	return p, max(peak, vmHWM(t, pid))
}
