// Command intake-bench measures intake against the naive scripted pipeline
// (see internal/bench) and writes bench-results.json. `make bench` runs it
// at full size; `make bench-smoke` at a size that only checks it works.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/partner-intake/partner-intake/internal/bench"
)

func main() { os.Exit(run()) }

func run() int {
	o := bench.Options{Out: os.Stderr}
	flag.IntVar(&o.LargeRows, "large-rows", 1_000_000, "rows of the large file")
	flag.IntVar(&o.HugeRows, "huge-rows", 5_000_000, "rows of the memory file (0 skips it)")
	flag.IntVar(&o.SmallFiles, "small-files", 1000, "small files in all")
	flag.IntVar(&o.SmallRows, "small-rows", 10, "rows per small file")
	flag.IntVar(&o.Partners, "partners", 10, "partners the small files spread over")
	flag.DurationVar(&o.WANDelay, "wan-delay", 25*time.Millisecond, "latency the wan workload's proxy adds each way between the daemon and sshd (0 skips it)")
	flag.IntVar(&o.FleetPartners, "fleet-partners", 1000, "partners of the fleet workload on one daemon and one sshd (0 skips it)")
	flag.IntVar(&o.FleetFiles, "fleet-files", 300, "files the fleet workload drops at random partners")
	flag.DurationVar(&o.FleetPoll, "fleet-poll", 30*time.Second, "the fleet partners' poll interval (@every)")
	flag.DurationVar(&o.FleetWindow, "fleet-window", time.Minute, "the time over which the fleet workload's files are dropped")
	flag.IntVar(&o.FailoverPartners, "failover-partners", 1000, "partners of the failover workload, over three replicas (0 skips it)")
	flag.IntVar(&o.FailoverFiles, "failover-files", 300, "files the failover workload drops at a steady rate")
	flag.DurationVar(&o.FailoverPoll, "failover-poll", 30*time.Second, "the failover partners' poll interval (@every)")
	flag.DurationVar(&o.FailoverLease, "failover-lease", 30*time.Second, "the failover replicas' lease")
	flag.DurationVar(&o.FailoverWindow, "failover-window", 2*time.Minute, "the time over which the failover workload's files are dropped (a replica is killed a quarter in)")
	flag.IntVar(&o.ModesRows, "modes-rows", 1_000_000, "rows of the modes workload: a snapshot deleting a tenth of them, a plan for approval of that many (0 skips it)")
	flag.Int64Var(&o.PGPBytes, "pgp-bytes", 1_000_000_000, "bytes of the pgp workload's signed and encrypted file (0 skips it)")
	flag.IntVar(&o.RejectsRows, "rejects-rows", 1_000_000, "rows of the rejects workload's file, a tenth of them rejected (0 skips it)")
	flag.StringVar(&o.FleetYAML, "fleet-daemon-yaml", "", "daemon-wide YAML added to the fleet daemon's config (to measure a session policy)")
	out := flag.String("out", "bench-results.json", "where to write the figures")
	only := flag.String("only", "", "comma-separated workloads to run (large, small, huge, wan, fleet, failover, modes, pgp, rejects); all when empty")
	flag.StringVar(&o.ProfileDir, "profile-dir", "", "write a CPU profile of every intake process here (intake is then built with -tags cpuprofile)")
	flag.DurationVar(&o.HeapProfileAfter, "heap-profile-after", 0, "with -profile-dir: every intake process also writes its heap in use this long after its start, and its CPU profile from then on, for as long again, to a file of its own (.idle)")
	flag.IntVar(&o.Repeat, "repeat", 1, "run the large, small, modes, pgp and rejects workloads this many times and report medians")
	flag.BoolVar(&o.RowHash, "row-hash", false, "give the target table intake_row_hash (the concurrent-edit guard on), to measure the guard's cost")
	flag.StringVar(&o.CompareBinary, "compare-binary", "", "another intake binary whose manifest duplicate runs alternate with this tree's (-compare-runs pairs; medians printed)")
	flag.IntVar(&o.CompareRuns, "compare-runs", 12, "pairs of runs for -compare-binary")
	flag.Parse()
	if *only != "" {
		o.Only = map[string]bool{}
		for _, w := range strings.Split(*only, ",") {
			o.Only[strings.TrimSpace(w)] = true
		}
	}
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "intake-bench-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	o.IntakeBinary = filepath.Join(dir, "intake")
	// built as `make static` builds what packages and images ship: a
	// static binary (no dynamic loader at each start, 5-7 ms of an
	// `intake run --once` here; docs/performance.md); with
	// -profile-dir, with the cpuprofile tag, the one build of intake that
	// writes the CPU profile INTAKE_CPUPROFILE names
	args := []string{"build", "-trimpath", "-ldflags", "-s -w", "-o", o.IntakeBinary}
	if o.ProfileDir != "" {
		args = append(args, "-tags", "cpuprofile")
	}
	build := exec.Command("go", append(args, "./cmd/intake")...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build intake: %v\n%s", err, b)
		return 1
	}
	res, err := bench.Run(context.Background(), o)
	if res != nil {
		res.Table(os.Stdout)
		if werr := res.Write(*out); werr != nil {
			fmt.Fprintln(os.Stderr, werr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}
