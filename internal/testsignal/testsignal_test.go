package testsignal_test

import (
	"testing"

	"github.com/partner-intake/partner-intake/internal/testsignal"
)

func TestZeroSignalIgnoresEvents(t *testing.T) {
	var s testsignal.Signal[int]
	s.Signal(1) // must not block nor panic
	if n := testing.AllocsPerRun(100, func() { s.Signal(2) }); n != 0 {
		t.Fatalf("an uninitialised signal allocates %v times per event", n)
	}
}

func TestWaitForSkipsToTheAwaitedValue(t *testing.T) {
	var s testsignal.Signal[int]
	s.Init(t)
	for i := range 5 {
		s.Signal(i)
	}
	if v := s.WaitFor(func(v int) bool { return v >= 3 }); v != 3 {
		t.Fatalf("got %d, want 3", v)
	}
	if v := s.WaitOrTimeout(); v != 4 {
		t.Fatalf("got %d, want 4", v)
	}
	s.Signal(5)
	s.Clear()
	go s.Signal(6)
	if v := s.WaitOrTimeout(); v != 6 {
		t.Fatalf("got %d after Clear, want 6", v)
	}
}

func TestAFullBufferDropsInsteadOfBlocking(t *testing.T) {
	var s testsignal.Signal[int]
	s.Init(t)
	for i := range 5000 {
		s.Signal(i)
	}
	if v := s.WaitOrTimeout(); v != 0 {
		t.Fatalf("got %d, want the first value kept", v)
	}
}
