// Package proctree reads the processes of this machine from /proc and
// tells which descend from a given one: a server's per-connection
// processes (sshd's), or a database's backends (PostgreSQL's), for the
// bench's CPU figures and the tests' looks at what a server does.
package proctree

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Proc is a process as /proc/<pid>/stat shows it: its parent, and the
// fields after "pid (comm) " (Fields[0] is the state, Fields[1] the
// parent, Fields[11:15] utime, stime, cutime and cstime).
type Proc struct {
	PPID   int
	Fields []string
}

// Snapshot is every process running now, by pid (one that exits while
// it is read is left out).
func Snapshot() (map[int]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	procs := map[int]Proc{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		procs[pid] = Proc{PPID: ppid, Fields: f}
	}
	return procs, nil
}

// InTree reports whether pid is root or one of its descendants in procs.
func InTree(procs map[int]Proc, pid, root int) bool {
	for q := pid; q > 1; q = procs[q].PPID {
		if q == root {
			return true
		}
		if _, ok := procs[q]; !ok {
			return false
		}
	}
	return false
}
