// Package bench measures intake against the pipeline a user would script
// instead (OpenSSH sftp get, sha256sum, psql \copy into a temp table and
// INSERT … ON CONFLICT DO UPDATE … WHERE … IS DISTINCT FROM), in one run on
// one machine, on the same throwaway PostgreSQL and real OpenSSH as the
// tests. It is a harness, not a test: it reports figures and never asserts
// timings.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/partner-intake/partner-intake/internal/pgtemp"
	"github.com/partner-intake/partner-intake/internal/sshdtest"
	"github.com/partner-intake/partner-intake/migrations"
)

// Options size a run.
type Options struct {
	LargeRows    int // rows of the large file (1M by default)
	HugeRows     int // rows of the memory file (5M); 0 skips it
	SmallFiles   int // small files in all
	SmallRows    int // rows per small file
	Partners     int // partners the small files spread over
	Out          io.Writer
	IntakeBinary string // a built intake binary
	// CompareBinary, if set, is another intake binary: after the manifest
	// duplicate, CompareRuns pairs of the same resend run alternately with
	// IntakeBinary and with it, and the medians are printed (a change's
	// cost on a one-shot run, measured in one session of the machine).
	CompareBinary string
	CompareRuns   int
	// Repeat runs the large, small, modes, pgp and rejects workloads this
	// many times and reports medians (1 when zero): of each run's ratio,
	// whose two sides ran back to back.
	Repeat int
	// Only, if set, names the workloads to run: large, small, huge, wan,
	// fleet, failover, modes, pgp, rejects.
	Only map[string]bool
	// ProfileDir, if set, receives a CPU profile of every intake process
	// (INTAKE_CPUPROFILE, honoured only by an IntakeBinary built with the
	// cpuprofile tag).
	ProfileDir string
	// HeapProfileAfter, with ProfileDir, also has every intake process
	// write its heap in use that long after its start (path.heap), and its
	// CPU profile from then on, for as long again, to path.idle
	HeapProfileAfter time.Duration
	// RowHash adds intake_row_hash to the target table: the
	// concurrent-edit guard on, to measure what it costs (off by default,
	// so the figures compare with earlier runs).
	RowHash bool
	// WANDelay is the latency the wan workload's proxy adds each way
	// (25 ms: a 50 ms round trip); 0 skips the workload.
	WANDelay time.Duration
	// The fleet workload: FleetPartners partners (0
	// skips it) polled every FleetPoll on one sshd, and FleetFiles files
	// dropped at random partners over FleetWindow.
	FleetPartners int
	FleetFiles    int
	FleetPoll     time.Duration
	FleetWindow   time.Duration
	// The failover workload: FailoverPartners partners (0 skips it)
	// polled every FailoverPoll by three replicas with affinity partner
	// and lease FailoverLease, FailoverFiles files dropped at a steady
	// rate over FailoverWindow, one replica SIGKILLed a quarter in.
	FailoverPartners int
	FailoverFiles    int
	FailoverPoll     time.Duration
	FailoverLease    time.Duration
	FailoverWindow   time.Duration
	// ModesRows: the rows of the modes workload (0 skips it): a snapshot
	// deleting a tenth of the partner's rows, and a plan for approval of
	// that many changed rows against that many loaded.
	ModesRows int
	// PGPBytes: the size of the pgp workload's signed and encrypted file
	// (0 skips it).
	PGPBytes int64
	// RejectsRows: the rows of the rejects workload's file, a tenth of
	// them rejected (0 skips it).
	RejectsRows int
	// FleetYAML is added to the fleet daemon's config (top-level keys,
	// e.g. "sessions: {max_parallel_dials: 1000}"), to measure a policy.
	FleetYAML string
}

func (o Options) runs(w string) bool { return len(o.Only) == 0 || o.Only[w] }

// Results are the figures of a run (bench-results.json).
type Results struct {
	LargeRows    int     `json:"large_rows"`
	LargeBytes   int64   `json:"large_bytes"`
	LargeFreshS  float64 `json:"large_fresh_s"`
	NaiveFreshS  float64 `json:"naive_fresh_s"`
	RatioFresh   float64 `json:"ratio_fresh"`
	LargeReplayS float64 `json:"large_replay_s"`
	NaiveReplayS float64 `json:"naive_replay_s"`
	RatioReplay  float64 `json:"ratio_replay"`
	DuplicateS   float64 `json:"duplicate_s"`
	// The concurrent-edit guard's cost: the same file
	// fresh into the emptied target and then again (every row unchanged),
	// with intake_row_hash on the target (on_outside_edit: keep), over the
	// unguarded runs above. Without -row-hash only.
	GuardFreshS      float64 `json:"large_fresh_guarded_s,omitempty"`
	GuardReplayS     float64 `json:"large_replay_guarded_s,omitempty"`
	RatioGuardFresh  float64 `json:"guard_fresh_over_unguarded,omitempty"`
	RatioGuardReplay float64 `json:"guard_replay_over_unguarded,omitempty"`
	RowHash          bool    `json:"row_hash_on_every_phase,omitempty"`
	// The physical floor: psql \copy of the same file
	// into an empty indexed table, and one set-based comparison of the
	// staged file against the target with no writes.
	FloorCopyS       float64 `json:"floor_copy_s"`
	RatioFloor       float64 `json:"ratio_floor"`
	FloorReplayS     float64 `json:"floor_replay_s"`
	RatioFloorReplay float64 `json:"ratio_floor_replay"`
	RatioDuplicate   float64 `json:"ratio_duplicate"`
	// An exact resend whose manifest states its sha256:
	// the daemon's whole run (as duplicate_s), the file's own time from
	// claim to duplicate in the ledger, and the run over the naive rerun.
	ManifestDuplicateS     float64 `json:"manifest_duplicate_s"`
	ManifestDuplicateFileS float64 `json:"manifest_duplicate_file_s"`
	DialMs                 float64 `json:"dial_ms"` // sftpconn.Dial to sshd on loopback, median of 15
	RatioManifestDuplicate float64 `json:"ratio_manifest_duplicate"`
	// The least a scripted pipeline does to decide the same resend from
	// its manifest: OpenSSH's sftp client logs in to the same sshd, reads
	// the manifest and leaves (median of 3, right after intake's run), and
	// intake's whole run over it. A one-shot process pays a login; this is
	// what the naive pipeline's own first step costs before any byte of
	// the file.
	FloorSFTPManifestS          float64 `json:"floor_sftp_manifest_s"`
	RatioManifestDuplicateFloor float64 `json:"ratio_manifest_duplicate_floor"`
	SmallFiles                  int     `json:"small_files"`
	SmallFilesPerS              float64 `json:"small_files_per_s"`
	PeakRSSMiB1M                float64 `json:"peak_rss_mib_1m"`
	// the replay's: its chunks' look-ups of the rows the target holds
	// keep a bounded share of the range they read
	PeakRSSMiB1MReplay float64 `json:"peak_rss_mib_1m_replay"`
	PeakRSSMiB5M       float64 `json:"peak_rss_mib_5m"`
	TwoReplicasFilesS  float64 `json:"two_replicas_files_per_s"`
	ScaleTwoOverOne    float64 `json:"scale_two_over_one"`
	DoubleApplies      int64   `json:"double_applies"`
	// The same from process start (files in ready/ when the daemons
	// start; their start, schema check and SSH logins included).
	SmallFilesPerSCold    float64 `json:"small_files_per_s_cold"`
	TwoReplicasFilesSCold float64 `json:"two_replicas_files_per_s_cold"`
	ScaleTwoOverOneCold   float64 `json:"scale_two_over_one_cold"`
	// Warm phases: the most seconds between two partners' first claims
	// (near 0: every partner's files were seen at the same poll).
	WarmClaimSpreadS float64   `json:"warm_first_claim_spread_s"`
	CPUOneS          float64   `json:"cpu_one_daemon_s"`
	CPUTwoS          []float64 `json:"cpu_two_daemons_s"`
	// CPU milliseconds per small file in the one-daemon phase, by process
	// tree: the daemon, PostgreSQL (postmaster and backends, the harness's
	// one progress connection included) and sshd (listener and sessions).
	SmallCPUms map[string]float64 `json:"small_cpu_ms_per_file,omitempty"`
	// The same in the two-daemon phase (intake: both daemons together).
	TwoCPUms map[string]float64 `json:"two_cpu_ms_per_file,omitempty"`
	// The one-daemon cold phase's (its start and logins spread over the files).
	SmallCPUmsCold map[string]float64 `json:"small_cpu_ms_per_file_cold,omitempty"`
	// Files each of the two daemons processed (partner affinity splits the
	// partners between them).
	TwoDaemonFiles map[string]int64 `json:"two_daemon_files,omitempty"`
	RowsCheckedOK  bool             `json:"rows_checked_ok"`
	// WAN: SFTP through a proxy adding WANRTTms per
	// round trip. The large file fresh (intake; the naive pipeline with
	// its sftp get through the same proxy), intake over its loopback
	// time, and the small files with one warm daemon, with the round
	// trips paid one after another per file (proxy count, warm-up and
	// settling included).
	WANRTTms             float64 `json:"wan_rtt_ms,omitempty"`
	WANLargeS            float64 `json:"wan_large_s,omitempty"`
	WANNaiveLargeS       float64 `json:"wan_naive_large_s,omitempty"`
	WANRatioNaive        float64 `json:"wan_ratio_naive,omitempty"`
	WANRatioLoopback     float64 `json:"wan_large_over_loopback,omitempty"`
	WANSmallFilesPerS    float64 `json:"wan_small_files_per_s,omitempty"`
	WANSmallTurnsPerFile float64 `json:"wan_small_round_trips_per_file,omitempty"`
	WANLargeTurns        int64   `json:"wan_large_round_trips,omitempty"`
	WANNaiveLargeTurns   int64   `json:"wan_naive_large_round_trips,omitempty"`
	// the bench process's CPU while intake's large WAN run ran: the
	// latency proxy's, which a real link does not cost the host
	WANLargeProxyCPUS float64   `json:"wan_large_proxy_cpu_s,omitempty"`
	WANDialMs         float64   `json:"wan_dial_ms,omitempty"` // sftpconn.Dial through the proxy, median of 15
	WANLargeRuns      []float64 `json:"wan_large_runs_s,omitempty"`
	// A fleet of partners on one daemon (fleet.go): the
	// daemon's peak RSS (VmHWM) with every session open and its RSS after
	// the first cycle; exec until every partner was polled once; CPU over
	// one idle poll interval of all partners (daemon, sshd, PostgreSQL);
	// sshd's CPU per login over the first cycle; a file's time from its
	// rename into ready/ to its archive.
	FleetPartners    int     `json:"fleet_partners,omitempty"`
	FleetFiles       int     `json:"fleet_files,omitempty"`
	FleetPollS       float64 `json:"fleet_poll_s,omitempty"`
	FleetRSSMiB      float64 `json:"fleet_rss_mib,omitempty"`
	FleetRSSFirstMiB float64 `json:"fleet_rss_after_first_cycle_mib,omitempty"`
	// the Go runtime's own account after the first cycle (the daemon's
	// /metrics): goroutines, heap in use, goroutine stacks
	FleetGoroutines    float64 `json:"fleet_goroutines,omitempty"`
	FleetHeapInuseMiB  float64 `json:"fleet_heap_inuse_mib,omitempty"`
	FleetStackInuseMiB float64 `json:"fleet_stack_inuse_mib,omitempty"`
	FleetFirstCycleS   float64 `json:"fleet_first_cycle_s,omitempty"`
	FleetStartS        float64 `json:"fleet_daemon_start_s,omitempty"`
	// the idle cycles: the second after the first cycle (steady), and the
	// first (the logins' aftermath)
	FleetIdleCPUS          float64 `json:"fleet_idle_cpu_s_per_cycle,omitempty"`
	FleetIdleFirstCPUS     float64 `json:"fleet_idle_first_cpu_s,omitempty"`
	FleetIdleSSHDCPUS      float64 `json:"fleet_idle_sshd_cpu_s_per_cycle,omitempty"`
	FleetIdlePGCPUS        float64 `json:"fleet_idle_postgres_cpu_s_per_cycle,omitempty"`
	FleetSSHDCPUmsPerLogin float64 `json:"fleet_sshd_cpu_ms_per_login,omitempty"`
	// FleetLogins: the SSH connections sshd held after the first cycle
	// (partners on one account share them: sessions.partners_per_connection);
	// FleetSSHDCPUmsPerPartner: sshd's CPU over the first cycle per partner.
	FleetLogins              int     `json:"fleet_ssh_logins,omitempty"`
	FleetSSHDCPUmsPerPartner float64 `json:"fleet_sshd_cpu_ms_per_partner,omitempty"`
	// FleetFirstCycleCPUS: CPU seconds of intake, sshd and postgres from
	// the daemon's exec to the end of its first cycle; FleetFirstCycleBusy:
	// the share of the machine's CPU time (all cores, /proc/stat) that
	// was busy meanwhile.
	FleetFirstCycleCPUS map[string]float64 `json:"fleet_first_cycle_cpu_s,omitempty"`
	FleetFirstCycleBusy float64            `json:"fleet_first_cycle_machine_busy,omitempty"`
	FleetLatencyP50S    float64            `json:"fleet_latency_p50_s,omitempty"`
	FleetLatencyP99S    float64            `json:"fleet_latency_p99_s,omitempty"`
	FleetLatencyMaxS    float64            `json:"fleet_latency_max_s,omitempty"`
	FleetPollErrors     int                `json:"fleet_poll_errors"`
	// The failover workload (failover.go): the orphaned partners' time
	// from the kill to a survivor's poll, the files' time from ready/ to
	// archive, rows lost and files taken twice.
	FailoverPartners    int     `json:"failover_partners,omitempty"`
	FailoverFiles       int     `json:"failover_files,omitempty"`
	FailoverPollS       float64 `json:"failover_poll_s,omitempty"`
	FailoverLeaseS      float64 `json:"failover_lease_s,omitempty"`
	FailoverOrphans     int     `json:"failover_orphans,omitempty"`
	FailoverOrphanP50S  float64 `json:"failover_orphan_repolled_p50_s,omitempty"`
	FailoverOrphanP99S  float64 `json:"failover_orphan_repolled_p99_s,omitempty"`
	FailoverOrphanMaxS  float64 `json:"failover_orphan_repolled_max_s,omitempty"`
	FailoverLatencyP50S float64 `json:"failover_latency_p50_s,omitempty"`
	FailoverLatencyP99S float64 `json:"failover_latency_p99_s,omitempty"`
	FailoverLatencyMaxS float64 `json:"failover_latency_max_s,omitempty"`
	// FailoverOrphanFiles: the files dropped at the killed replica's
	// partners after the kill, and their p99 from ready/ to archive.
	FailoverOrphanFiles     int     `json:"failover_orphan_files,omitempty"`
	FailoverOrphanFilesP99S float64 `json:"failover_orphan_files_latency_p99_s,omitempty"`
	FailoverRowsLost        int64   `json:"failover_rows_lost"`
	FailoverPollErrors      int     `json:"failover_poll_errors"`
	FailoverDuplicated      int     `json:"failover_files_taken_twice"`
	// The round trips paid in sequence during the small files' burst
	// alone (from the files' appearance to the last archive, the polls'
	// listings included), per file, and the CPU each file cost the
	// daemon, PostgreSQL and sshd in that burst: figures the machine's
	// load moves less than files per second.
	WANSmallBurstTurnsPerFile float64            `json:"wan_small_burst_round_trips_per_file,omitempty"`
	WANSmallCPUms             map[string]float64 `json:"wan_small_cpu_ms_per_file,omitempty"`
	// The modes workload (modes.go): a snapshot of 0.9 n rows over n
	// loaded (deleting 0.1 n) over the same file fresh; a plan for
	// approval (exec until awaiting_approval) of n changed rows over n
	// loaded, over the run that applies it after `intake approve`.
	ModesRows           int     `json:"modes_rows,omitempty"`
	SnapshotFreshS      float64 `json:"snapshot_fresh_s,omitempty"`
	SnapshotDeleteS     float64 `json:"snapshot_delete_s,omitempty"`
	SnapshotDeleteRatio float64 `json:"snapshot_delete_ratio,omitempty"`
	PlanS               float64 `json:"plan_s,omitempty"`
	PlanApplyS          float64 `json:"plan_apply_s,omitempty"`
	PlanRatio           float64 `json:"plan_ratio,omitempty"`
	// The pgp workload (pgp.go): a signed and encrypted file, intake's
	// run over `gpg --decrypt | psql \copy`, and intake's peak RSS.
	PGPBytes      int64   `json:"pgp_bytes,omitempty"`
	PGPRows       int     `json:"pgp_rows,omitempty"`
	PGPS          float64 `json:"pgp_s,omitempty"`
	PGPFloorS     float64 `json:"pgp_floor_s,omitempty"`
	PGPRatioFloor float64 `json:"pgp_ratio_floor,omitempty"`
	PGPPeakRSSMiB float64 `json:"pgp_peak_rss_mib,omitempty"`
	// CPU seconds by process over each run: intake's (intake, postgres,
	// sshd) and the floor's (gpg_psql, postgres); on a machine of two
	// cores, half their sum bounds the run from below.
	PGPCPUS      map[string]float64 `json:"pgp_cpu_s,omitempty"`
	PGPFloorCPUS map[string]float64 `json:"pgp_floor_cpu_s,omitempty"`
	// The rejects workload (rejects.go): a tenth of the rows rejected and
	// reported, over the same file without rejects, and its peak RSS.
	RejectsRows       int     `json:"rejects_rows,omitempty"`
	RejectsS          float64 `json:"rejects_s,omitempty"`
	RejectsCleanS     float64 `json:"rejects_clean_s,omitempty"`
	RejectsRatio      float64 `json:"rejects_ratio,omitempty"`
	RejectsPeakRSSMiB float64 `json:"rejects_peak_rss_mib,omitempty"`
	// With Repeat > 1: the figures above are medians of these runs.
	LargeRuns   []*Results `json:"large_runs,omitempty"`
	SmallRuns   []*Results `json:"small_runs,omitempty"`
	ModesRuns   []*Results `json:"modes_runs,omitempty"`
	PGPRuns     []*Results `json:"pgp_runs,omitempty"`
	RejectsRuns []*Results `json:"rejects_runs,omitempty"`
}

// median of one figure over runs.
func median(runs []*Results, f func(*Results) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	sort.Float64s(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// medians sets each field of res to the median of that field over runs.
func medians(res *Results, runs []*Results, fields ...func(*Results) *float64) {
	for _, f := range fields {
		*f(res) = median(runs, func(r *Results) float64 { return *f(r) })
	}
}

// medianMap is the median of each key of a per-run map.
func medianMap(runs []*Results, m func(*Results) map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k := range m(runs[0]) {
		out[k] = median(runs, func(r *Results) float64 { return m(r)[k] })
	}
	return out
}

// env is one run's servers and the helpers every measurement runs on
// them (databases, sites, configs, daemons started and settled).
type env struct {
	o    Options
	pg   *pgtemp.Server
	sshd *sshdtest.Server
	dir  string
	seq  int
	// wan, while set, is the latency proxy every SFTP connection of the
	// daemons and the naive pipeline goes through, and wanKnownHosts pins
	// sshd's host key under the proxy's address.
	wan           *wanProxy
	wanKnownHosts string

	// the measurements, by kind, each over this rig
	fileWorkloads
	baselines
	wanRuns
	replicaRuns
	featureRuns
}

// sshAddr is where SFTP clients connect: sshd, or the latency proxy.
func (e *env) sshAddr() string {
	if e.wan != nil {
		return e.wan.Addr()
	}
	return e.sshd.Addr
}

// knownHosts pins sshd's host key under sshAddr.
func (e *env) knownHosts() string {
	if e.wan != nil {
		return e.wanKnownHosts
	}
	return e.sshd.KnownHostsFile
}

// Run measures everything and returns the figures.
func Run(ctx context.Context, o Options) (*Results, error) {
	for _, tool := range []string{"sftp", "sha256sum", "psql"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("bench needs %s (apt-get install -y openssh-client postgresql-client coreutils): %w", tool, err)
		}
	}
	e := &env{o: o}
	e.fileWorkloads, e.baselines, e.wanRuns = fileWorkloads{e}, baselines{e}, wanRuns{e}
	e.replicaRuns, e.featureRuns = replicaRuns{e}, featureRuns{e}
	var err error
	if e.dir, err = os.MkdirTemp("", "intake-bench-"); err != nil {
		return nil, err
	}
	defer func() {
		if os.Getenv("BENCH_KEEP") == "" {
			os.RemoveAll(e.dir)
		}
	}()
	e.say("starting PostgreSQL (durable: fsync on) and OpenSSH sshd")
	if e.pg, err = pgtemp.Start(pgtemp.Options{Durable: true}); err != nil {
		return nil, err
	}
	defer e.pg.Close()
	if e.sshd, err = sshdtest.Start(); err != nil {
		return nil, err
	}
	defer e.sshd.Close()
	res := &Results{LargeRows: o.LargeRows, SmallFiles: o.SmallFiles}
	// Each workload runs Repeat times (a fresh database each time); the
	// figures are the medians, the runs are kept beside them.
	if o.runs("large") {
		var runs []*Results
		for i := 0; i < max(o.Repeat, 1); i++ {
			r := &Results{LargeRows: o.LargeRows}
			if err := e.large(ctx, r); err != nil {
				return res, fmt.Errorf("large file: %w", err)
			}
			runs = append(runs, r)
		}
		res.LargeBytes = runs[0].LargeBytes
		res.RowsCheckedOK = true
		for _, r := range runs {
			res.RowsCheckedOK = res.RowsCheckedOK && r.RowsCheckedOK
		}
		medians(res, runs,
			func(r *Results) *float64 { return &r.LargeFreshS },
			func(r *Results) *float64 { return &r.NaiveFreshS },
			func(r *Results) *float64 { return &r.RatioFresh },
			func(r *Results) *float64 { return &r.LargeReplayS },
			func(r *Results) *float64 { return &r.NaiveReplayS },
			func(r *Results) *float64 { return &r.RatioReplay },
			func(r *Results) *float64 { return &r.DuplicateS },
			func(r *Results) *float64 { return &r.RatioDuplicate },
			func(r *Results) *float64 { return &r.ManifestDuplicateS },
			func(r *Results) *float64 { return &r.ManifestDuplicateFileS },
			func(r *Results) *float64 { return &r.DialMs },
			func(r *Results) *float64 { return &r.RatioManifestDuplicate },
			func(r *Results) *float64 { return &r.FloorSFTPManifestS },
			func(r *Results) *float64 { return &r.RatioManifestDuplicateFloor },
			func(r *Results) *float64 { return &r.FloorCopyS },
			func(r *Results) *float64 { return &r.RatioFloor },
			func(r *Results) *float64 { return &r.FloorReplayS },
			func(r *Results) *float64 { return &r.RatioFloorReplay },
			func(r *Results) *float64 { return &r.PeakRSSMiB1M },
			func(r *Results) *float64 { return &r.PeakRSSMiB1MReplay },
			func(r *Results) *float64 { return &r.GuardFreshS },
			func(r *Results) *float64 { return &r.GuardReplayS },
			func(r *Results) *float64 { return &r.RatioGuardFresh },
			func(r *Results) *float64 { return &r.RatioGuardReplay })
		res.RowHash = o.RowHash
		if len(runs) > 1 {
			res.LargeRuns = runs
		}
	}
	if o.runs("small") {
		var runs []*Results
		for i := 0; i < max(o.Repeat, 1); i++ {
			r := &Results{}
			if err := e.small(ctx, r); err != nil {
				return res, fmt.Errorf("small files: %w", err)
			}
			runs = append(runs, r)
		}
		medians(res, runs,
			func(r *Results) *float64 { return &r.SmallFilesPerS },
			func(r *Results) *float64 { return &r.TwoReplicasFilesS },
			func(r *Results) *float64 { return &r.ScaleTwoOverOne },
			func(r *Results) *float64 { return &r.SmallFilesPerSCold },
			func(r *Results) *float64 { return &r.TwoReplicasFilesSCold },
			func(r *Results) *float64 { return &r.ScaleTwoOverOneCold },
			func(r *Results) *float64 { return &r.CPUOneS })
		for _, r := range runs {
			res.DoubleApplies += r.DoubleApplies
		}
		res.CPUTwoS = runs[len(runs)/2].CPUTwoS
		res.SmallCPUms = medianMap(runs, func(r *Results) map[string]float64 { return r.SmallCPUms })
		res.TwoCPUms = medianMap(runs, func(r *Results) map[string]float64 { return r.TwoCPUms })
		res.SmallCPUmsCold = medianMap(runs, func(r *Results) map[string]float64 { return r.SmallCPUmsCold })
		if len(runs) > 1 {
			res.SmallRuns = runs
		}
	}
	if o.WANDelay > 0 && o.runs("wan") {
		if err := e.wanWorkload(ctx, res); err != nil {
			return res, fmt.Errorf("wan: %w", err)
		}
		if res.LargeFreshS > 0 {
			res.WANRatioLoopback = res.WANLargeS / res.LargeFreshS
		}
	}
	// the workloads run in this order, when sized and asked for: once
	// each, or Repeat times those with medians (repeated)
	for _, w := range []struct {
		on         bool
		name, what string
		run        func(context.Context, *Results) error
		repeated   *repeated
	}{
		{o.FleetPartners > 0, "fleet", "fleet", e.fleet, nil},
		{o.FailoverPartners > 0, "failover", "failover", e.failover, nil},
		{o.ModesRows > 0, "modes", "modes", e.modes, modesRepeated},
		{o.PGPBytes > 0, "pgp", "pgp", e.pgp, pgpRepeated},
		{o.RejectsRows > 0, "rejects", "rejects", e.rejects, rejectsRepeated},
		{o.HugeRows > 0, "huge", "memory file", e.huge, nil},
	} {
		if !w.on || !o.runs(w.name) {
			continue
		}
		if w.repeated == nil {
			if err := w.run(ctx, res); err != nil {
				return res, fmt.Errorf("%s: %w", w.what, err)
			}
			continue
		}
		var runs []*Results
		for range max(o.Repeat, 1) {
			r := &Results{}
			if err := w.run(ctx, r); err != nil {
				// the runs before it stand; without any, this one's
				// figures so far
				if len(runs) == 0 {
					runs = append(runs, r)
				}
				w.repeated.merge(res, runs)
				return res, fmt.Errorf("%s: %w", w.what, err)
			}
			runs = append(runs, r)
		}
		w.repeated.merge(res, runs)
	}
	return res, nil
}

// repeated is how a workload's runs make its figures: its counts (the
// first run's), the medians of its figures and of its CPU by process,
// and where the runs are kept.
type repeated struct {
	counts  func(res, first *Results)
	figures []func(*Results) *float64
	cpu     []func(*Results) *map[string]float64
	kept    func(*Results) *[]*Results
}

func (w *repeated) merge(res *Results, runs []*Results) {
	w.counts(res, runs[0])
	medians(res, runs, w.figures...)
	for _, m := range w.cpu {
		*m(res) = medianMap(runs, func(r *Results) map[string]float64 { return *m(r) })
	}
	if len(runs) > 1 {
		*w.kept(res) = runs
	}
}

var (
	modesRepeated = &repeated{
		counts: func(res, r *Results) { res.ModesRows = r.ModesRows },
		figures: []func(*Results) *float64{
			func(r *Results) *float64 { return &r.SnapshotFreshS },
			func(r *Results) *float64 { return &r.SnapshotDeleteS },
			func(r *Results) *float64 { return &r.SnapshotDeleteRatio },
			func(r *Results) *float64 { return &r.PlanS },
			func(r *Results) *float64 { return &r.PlanApplyS },
			func(r *Results) *float64 { return &r.PlanRatio }},
		kept: func(r *Results) *[]*Results { return &r.ModesRuns },
	}
	pgpRepeated = &repeated{
		counts: func(res, r *Results) { res.PGPBytes, res.PGPRows = r.PGPBytes, r.PGPRows },
		figures: []func(*Results) *float64{
			func(r *Results) *float64 { return &r.PGPS },
			func(r *Results) *float64 { return &r.PGPFloorS },
			func(r *Results) *float64 { return &r.PGPRatioFloor },
			func(r *Results) *float64 { return &r.PGPPeakRSSMiB }},
		cpu: []func(*Results) *map[string]float64{
			func(r *Results) *map[string]float64 { return &r.PGPCPUS },
			func(r *Results) *map[string]float64 { return &r.PGPFloorCPUS }},
		kept: func(r *Results) *[]*Results { return &r.PGPRuns },
	}
	rejectsRepeated = &repeated{
		counts: func(res, r *Results) { res.RejectsRows = r.RejectsRows },
		figures: []func(*Results) *float64{
			func(r *Results) *float64 { return &r.RejectsS },
			func(r *Results) *float64 { return &r.RejectsCleanS },
			func(r *Results) *float64 { return &r.RejectsRatio },
			func(r *Results) *float64 { return &r.RejectsPeakRSSMiB }},
		kept: func(r *Results) *[]*Results { return &r.RejectsRuns },
	}
)

func (e *env) say(format string, args ...any) {
	fmt.Fprintf(e.o.Out, "# "+format+"\n", args...)
}

// databaseAndSite is a workload's start: a fresh database (database) and
// the partner site name (partnerSite).
func (e *env) databaseAndSite(ctx context.Context, name string) (url, root string, err error) {
	if url, err = e.database(ctx); err != nil {
		return "", "", err
	}
	if root, err = e.partnerSite(name); err != nil {
		return "", "", err
	}
	return url, root, nil
}

// database creates a migrated database with both target tables.
func (e *env) database(ctx context.Context) (string, error) {
	if err := e.dropDatabases(ctx); err != nil {
		return "", err
	}
	e.seq++
	url, err := e.pg.CreateDB(ctx, fmt.Sprintf("bench%d", e.seq))
	if err != nil {
		return "", err
	}
	if _, err := migrations.Up(url); err != nil {
		return "", err
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err = c.Exec(ctx, targetDDL); err != nil {
		return url, err
	}
	if e.o.RowHash {
		_, err = c.Exec(ctx, `ALTER TABLE bench_orders ADD COLUMN intake_row_hash bigint`)
	}
	return url, err
}

// dropDatabases drops the databases of the runs before: each run makes
// its own and is done with it when the next begins. Left in place, a
// full run's dozen databases of a million rows and more each (several
// GB) stayed on the machine under the later phases. (Dropping them did
// not take away the WAN phase's slowdown in full runs: docs/performance.md.)
func (e *env) dropDatabases(ctx context.Context) error {
	if e.seq == 0 {
		return nil
	}
	c, err := pgx.Connect(ctx, e.pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	for i := 1; i <= e.seq; i++ {
		name := pgx.Identifier{fmt.Sprintf("bench%d", i)}.Sanitize()
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
	}
	return nil
}

const targetDDL = `
CREATE TABLE bench_orders (
    partner_id text NOT NULL, order_id text NOT NULL, email text, amount numeric(12,2) NOT NULL,
    status text NOT NULL, placed_at timestamptz NOT NULL, note text, qty integer,
    last_intake_id bigint NOT NULL, PRIMARY KEY (partner_id, order_id));
CREATE TABLE naive_orders (
    partner_id text NOT NULL, order_id text NOT NULL, email text, amount numeric(12,2) NOT NULL,
    status text NOT NULL, placed_at timestamptz NOT NULL, note text, qty integer,
    batch_id text NOT NULL, PRIMARY KEY (partner_id, order_id));
CREATE TABLE floor_orders (
    partner_id text NOT NULL DEFAULT 'big', order_id text NOT NULL, email text, amount numeric(12,2) NOT NULL,
    status text NOT NULL, placed_at timestamptz NOT NULL, note text, qty integer,
    last_intake_id bigint NOT NULL DEFAULT 0, PRIMARY KEY (partner_id, order_id));`

// writeCSV writes n orders-like rows (text key, email, decimal, enum,
// timestamp, text, int), about 80 bytes each.
func writeCSV(path string, n, seed int) (int64, error) {
	return writeCSVVariant(path, n, seed, variant{})
}

// variant alters the rows writeCSV writes: bump is added to every row's
// qty (the same keys with a changed value), and with rejectEvery every
// rejectEvery-th row has a status outside the feed's enum (rejected
// not_in_enum).
type variant struct {
	bump, rejectEvery int
}

// writeCSVVariant is writeCSV with the rows altered by v.
func writeCSVVariant(path string, n, seed int, v variant) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	// 1 MiB for the large files, a line's worth more than the file for
	// small ones: a 1 MiB buffer for each of 1000 small files left the
	// collector and the scavenger returning 1 GB to the system during the
	// measured phase, on the cores the pipeline runs on
	w := bufio.NewWriterSize(f, min(1<<20, 96*n+4096))
	w.WriteString(csvHeader)
	var line []byte
	for i := 0; i < n; i++ {
		line = orderRow(line[:0], i, i+seed, v)
		w.Write(line)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	st, _ := f.Stat()
	return st.Size(), f.Close()
}

const csvHeader = "order_id,email,amount,status,placed_at,note,qty\n"

var statuses = []string{"new", "paid", "shipped", "returned"}

// orderRow appends the i-th row of a file, of key k, to b.
func orderRow(b []byte, i, k int, v variant) []byte {
	status := statuses[k%4]
	if v.rejectEvery > 0 && i%v.rejectEvery == v.rejectEvery-1 {
		status = "lost"
	}
	return fmt.Appendf(b, "ORD-%09d,customer%d@example.com,%d.%02d,%s,2026-%02d-%02dT%02d:%02d:00Z,deliver to dock %d,%d\n",
		k, k%100000, k%10000, k%100, status, 1+k%12, 1+k%28, k%24, k%60, k%50, 1+k%9+v.bump)
}

// partnerSite makes a partner root with ready/ on sshd.
func (e *env) partnerSite(id string) (string, error) {
	e.seq++
	root, err := e.sshd.PartnerRoot(fmt.Sprintf("%s-%d", id, e.seq))
	if err != nil {
		return "", err
	}
	for _, d := range []string{"incoming", "ready"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	return root, nil
}

// partnerSites makes n partner sites named prefix0000, prefix0001, …:
// their roots by id, and the ids in order.
func (e *env) partnerSites(prefix string, n int) (map[string]string, []string, error) {
	roots := map[string]string{}
	var order []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s%04d", prefix, i)
		root, err := e.partnerSite(id)
		if err != nil {
			return nil, nil, err
		}
		roots[id] = root
		order = append(order, id)
	}
	return roots, order, nil
}

// endedEarly is the error of the first of procs that has exited, nil
// while every one runs.
func endedEarly(procs []*proc, when string) error {
	for _, p := range procs {
		if p.exited() {
			_, _, _, err := p.wait()
			return fmt.Errorf("a daemon ended %s: %v", when, err)
		}
	}
	return nil
}

// config writes an intake config for the given partners (id -> root),
// polled every second.
func (e *env) config(worker string, roots map[string]string, order []string) (string, error) {
	return e.configPoll(worker, roots, order, "@every 1s", "")
}

// configPoll writes an intake config for the given partners polled on poll.
// extra, if set, is added to the daemon-wide keys.
func (e *env) configPoll(worker string, roots map[string]string, order []string, poll, extra string) (string, error) {
	return e.configDaemon(daemonConfig{worker: worker, lease: 2 * time.Minute, reconcile: time.Hour, spool: filepath.Join(e.dir, "spool"), extra: extra}, roots, order, poll)
}

// configFeed writes an intake config for one partner polled every
// second, its orders feed given the keys feed and the max_reject_ratio
// rejectRatio ("" for the default 0.01).
func (e *env) configFeed(worker, id, root, feed, rejectRatio string) (string, error) {
	return e.configDaemon(daemonConfig{worker: worker, lease: 2 * time.Minute, reconcile: time.Hour, spool: filepath.Join(e.dir, "spool"), feed: feed, rejectRatio: rejectRatio},
		map[string]string{id: root}, []string{id}, "@every 1s")
}

// daemonConfig is a bench daemon's own keys.
type daemonConfig struct {
	worker           string
	lease, reconcile time.Duration
	spool            string
	extra            string // added to the daemon-wide keys
	// feed is added to the orders feed's keys (eight spaces in, e.g.
	// "        mode: snapshot\n"), and rejectRatio replaces its
	// max_reject_ratio (0.01 when empty)
	feed, rejectRatio string
	// http is the ops listener's address ("": off)
	http string
}

// configDaemon writes an intake config of d for the given partners
// polled on poll.
func (e *env) configDaemon(d daemonConfig, roots map[string]string, order []string, poll string) (string, error) {
	worker, extra := d.worker, d.extra
	rejectRatio := d.rejectRatio
	if rejectRatio == "" {
		rejectRatio = "0.01"
	}
	var b strings.Builder
	// Two connections per daemon: on this bench's two cores, shared with
	// PostgreSQL, more connections only add contention (docs/performance.md);
	// every phase, one daemon or two, runs with the same config.
	listen := d.http
	if listen == "" {
		listen = "off"
	}
	fmt.Fprintf(&b, "worker_id: %s\nlease: %s\ndrain: 5s\ndatabase:\n  url_env: INTAKE_DATABASE_URL\n  max_conns: 2\nspool:\n  dir: %s\n  min_free_bytes: 1\nhttp:\n  listen: %q\nreconcile:\n  schedule: \"@every %s\"\n%s\npartners:\n",
		worker, d.lease, d.spool, listen, d.reconcile, extra)
	for _, id := range order {
		fmt.Fprintf(&b, `  - id: %s
    poll: %q
    sftp: {address: %q, user: %q, private_key_file: %q, known_hosts_file: %q, root: %q}
    limits: {max_files_per_poll: 100000, max_file_bytes: 4294967296, max_rows: 100000000}
    feeds:
      - name: orders
        pattern: 'orders-.*\.csv'
        max_reject_ratio: %s
        columns:
          - {name: order_id, type: text, required: true, max_length: 32}
          - {name: email, type: email}
          - {name: amount, type: decimal, scale: 2, required: true}
          - {name: status, type: enum, values: [new, paid, shipped, returned], required: true}
          - {name: placed_at, type: timestamp, required: true}
          - {name: note, type: text, max_length: 200}
          - {name: qty, type: integer}
        key: [order_id]
        target: bench_orders
%s`, id, poll, e.sshAddr(), e.sshd.User, e.sshd.ClientKeyFile, e.knownHosts(), roots[id], rejectRatio, d.feed)
	}
	e.seq++ // a config of its own: two configs of one worker differ
	p := filepath.Join(e.dir, fmt.Sprintf("intake-%s-%d.yaml", worker, e.seq))
	return p, os.WriteFile(p, []byte(b.String()), 0o600)
}

// proc is a finished or running intake process.
type proc struct {
	cmd   *exec.Cmd
	start time.Time
	done  chan struct{} // closed when the process has exited
	err   error         // its Wait error, once done
	end   time.Time
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill ends the process if it still runs and waits for it to exit.
func (p *proc) kill() {
	if !p.exited() {
		p.cmd.Process.Kill()
		<-p.done
	}
}

// killAll kills each of procs still running (a run's deferred end).
func killAll(procs []*proc) {
	for _, p := range procs {
		p.kill()
	}
}

func (e *env) start(url, cfg string, args ...string) (*proc, error) {
	args = append(args, "--config", cfg)
	if lv := os.Getenv("BENCH_LOG_LEVEL"); lv != "" {
		args = append(args, "--log-level", lv) // e.g. debug: every file's step timings in the daemon's log
	}
	cmd := exec.Command(e.o.IntakeBinary, args...)
	cmd.Env = append(os.Environ(), "INTAKE_DATABASE_URL="+url)
	if e.o.ProfileDir != "" {
		e.seq++
		cmd.Env = append(cmd.Env, "INTAKE_CPUPROFILE="+filepath.Join(e.o.ProfileDir, fmt.Sprintf("%s-%d.pprof", filepath.Base(cfg), e.seq)))
		if e.o.HeapProfileAfter > 0 {
			cmd.Env = append(cmd.Env, fmt.Sprintf("INTAKE_HEAPPROFILE_AFTER=%s", e.o.HeapProfileAfter))
		}
	}
	log, err := os.OpenFile(cfg+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	p := &proc{cmd: cmd, start: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		p.end = time.Now()
		close(p.done)
	}()
	return p, nil
}

// wait returns wall seconds, peak RSS in MiB and CPU seconds.
func (p *proc) wait() (wall, rssMiB, cpu float64, err error) {
	<-p.done
	err = p.err
	wall = p.end.Sub(p.start).Seconds()
	if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rssMiB = float64(ru.Maxrss) / 1024
		cpu = rusageCPU(ru)
	}
	if err != nil {
		log, _ := os.ReadFile(p.cmd.Args[len(p.cmd.Args)-1] + ".log")
		err = fmt.Errorf("%v: %s", err, tail(string(log)))
	}
	return
}

func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// settledRun is runOnce once the machine has settled (settle): how a
// workload times a run of the files it dropped.
func (e *env) settledRun(ctx context.Context, url, cfg string) (wall, rss, cpu float64, err error) {
	if err := e.settle(ctx, url); err != nil {
		return 0, 0, 0, err
	}
	return e.runOnce(url, cfg)
}

// runOnce runs `intake run --once` and measures it.
func (e *env) runOnce(url, cfg string) (wall, rss, cpu float64, err error) {
	p, err := e.start(url, cfg, "run", "--once")
	if err != nil {
		return 0, 0, 0, err
	}
	return p.wait()
}

func (e *env) count(ctx context.Context, url, q string, args ...any) (int64, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int64
	err = c.QueryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// Write stores results as JSON.
func (r *Results) Write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
