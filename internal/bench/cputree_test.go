package bench

import (
	"os/exec"
	"testing"
	"time"
)

// A child that burned CPU and was reaped still counts for its parent's
// tree (cutime), and a process outside the tree does not.
func TestTreeCPUCountsReapedDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", `sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; echo done; sleep 5`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil { // the busy child has exited and was reaped
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	got, err := treeCPU(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if got < 0.05 {
		t.Fatalf("tree CPU %.3f s, want the reaped child's busy loop (well over 0.05 s)", got)
	}
	idle := exec.Command("sleep", "5")
	if err := idle.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { idle.Process.Kill(); idle.Wait() }()
	if c, err := treeCPU(idle.Process.Pid); err != nil || c > 0.02 {
		t.Fatalf("an idle process's tree: %.3f s, %v", c, err)
	}
	if _, err := treeCPU(1 << 30); err == nil {
		t.Fatal("a pid that does not exist gave no error")
	}
}
