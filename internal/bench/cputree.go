package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/partner-intake/partner-intake/internal/proctree"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat
// (100 on every Linux architecture Go supports but alpha and ia64).
const clockTicks = 100

// treeCPU returns the CPU seconds (user + system) used so far by the
// process root and all its descendants, those that already exited and were
// reaped inside the tree included (cutime, cstime). PostgreSQL's backends
// and sshd's per-connection processes are such descendants.
func treeCPU(root int) (float64, error) {
	procs, err := proctree.Snapshot()
	if err != nil {
		return 0, err
	}
	if _, ok := procs[root]; !ok {
		return 0, fmt.Errorf("process %d is not running", root)
	}
	var total float64
	for pid, p := range procs {
		if !proctree.InTree(procs, pid, root) {
			continue
		}
		var ticks float64
		for _, k := range p.Fields[11:15] { // utime stime cutime cstime
			v, _ := strconv.ParseFloat(k, 64)
			ticks += v
		}
		total += ticks / clockTicks
	}
	return total, nil
}

// serverCPU returns the CPU seconds PostgreSQL and sshd have used so far.
func (e *env) serverCPU() (pg, sshd float64, err error) {
	b, err := os.ReadFile(filepath.Join(e.pg.Dir, "data", "postmaster.pid"))
	if err != nil {
		return 0, 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	if pg, err = treeCPU(pid); err != nil {
		return 0, 0, err
	}
	sshd, err = treeCPU(e.sshd.Pid())
	return pg, sshd, err
}

// serverCPUOver runs f and returns the CPU seconds PostgreSQL and sshd
// used meanwhile.
func (e *env) serverCPUOver(f func() error) (pg, sshd float64, err error) {
	pg0, sshd0, err := e.serverCPU()
	if err != nil {
		return 0, 0, err
	}
	if err := f(); err != nil {
		return 0, 0, err
	}
	pg1, sshd1, err := e.serverCPU()
	return pg1 - pg0, sshd1 - sshd0, err
}

// rusageCPU is a process's CPU seconds (user + system) from its rusage.
func rusageCPU(ru *syscall.Rusage) float64 {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// machineCPU returns the machine's busy and total CPU time so far, in
// ticks over all cores (/proc/stat's cpu line: idle, iowait and steal are
// not busy; guest time is counted in user already).
func machineCPU() (busy, total float64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, k := range f[1:] {
		v, err := strconv.ParseFloat(k, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest, guest_nice
			break
		}
		total += v
		if i != 3 && i != 4 && i != 7 { // idle, iowait, steal
			busy += v
		}
	}
	return busy, total, nil
}
