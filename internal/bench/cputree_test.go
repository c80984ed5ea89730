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
	// the reaped child's time shows in its parent's accounting
	var got float64
	deadline := time.Now().Add(5 * time.Second)
	for tick := time.NewTicker(10 * time.Millisecond); got < 0.05 && time.Now().Before(deadline); <-tick.C {
		if got, err = treeCPU(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
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

// A busy loop in this process shows as busy machine time: at least the
// loop's own CPU time is counted busy, and busy never exceeds the total.
func TestMachineCPUCountsBusyTime(t *testing.T) {
	b0, t0, err := machineCPU()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	b1, t1, err := machineCPU()
	if err != nil {
		t.Fatal(err)
	}
	if busy, all := b1-b0, t1-t0; busy < 15 || busy > all {
		t.Fatalf("a 0.3 s busy loop: %.0f busy ticks of %.0f", busy, all)
	}
}
