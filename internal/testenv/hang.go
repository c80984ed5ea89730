package testenv

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"time"
)

// hangMargin is how long before the test binary's own -test.timeout the
// hang report is printed.
const hangMargin = time.Minute

// armHangReport prints a short report of what is still running shortly
// before the test binary's -test.timeout would panic, and ends the binary
// (exit 2) once cleanup has stopped the package's servers. The timeout's
// own panic puts the running tests at the top of a goroutine dump
// thousands of lines long, and a CI log that keeps only its tail loses
// them; this report is printed last: the module's goroutines counted by
// where they wait, then each test still running with its stack. stop
// disarms it.
func armHangReport(cleanup func()) (stop func()) {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return func() {}
	}
	timeout, _ := g.Get().(time.Duration)
	if timeout <= 2*hangMargin {
		return func() {}
	}
	start := time.Now()
	t := time.AfterFunc(timeout-hangMargin, func() {
		fmt.Fprint(os.Stderr, hangReport(Stacks(), time.Since(start), timeout))
		cleanup()
		os.Exit(2)
	})
	return func() { t.Stop() }
}

// Stacks is every goroutine's stack, as runtime.Stack gives them.
func Stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

const module = "github.com/partner-intake/partner-intake/"

// hangReport reads a goroutine dump: the goroutines running a test
// function (testing's tRunner, not its main goroutine) are printed whole,
// the module's others counted by their innermost frame of the module and
// state.
func hangReport(dump string, ran, timeout time.Duration) string {
	var tests []string
	counts := map[string]int{}
	for _, g := range strings.Split(dump, "\n\n") {
		header, frames, _ := strings.Cut(g, "\n")
		if strings.Contains(frames, "\ntesting.tRunner(") && !strings.Contains(frames, "testing.(*M).Run(") {
			tests = append(tests, g)
			continue
		}
		for _, line := range strings.Split(frames, "\n") {
			if strings.HasPrefix(line, module) {
				state := header
				if i := strings.Index(state, "["); i >= 0 {
					state = strings.TrimSuffix(state[i:], ":")
				}
				fn := line
				if i := strings.LastIndex(fn, "("); i > 0 {
					fn = fn[:i]
				}
				counts[strings.TrimPrefix(fn, module)+" "+state]++
				break
			}
		}
	}
	var b strings.Builder
	b.WriteString("\ntestenv: the module's other goroutines, counted by their innermost frame of the module and state:\n")
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %4d × %s\n", counts[k], k)
	}
	fmt.Fprintf(&b, "\ntestenv: the goroutines of the %d tests still running:\n", len(tests))
	for _, g := range tests {
		b.WriteString(g)
		b.WriteString("\n\n")
	}
	fmt.Fprintf(&b, "testenv: tests still running after %s of the %s timeout (the goroutines above); ended here\n", ran.Round(time.Second), timeout)
	return b.String()
}
