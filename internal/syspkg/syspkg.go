// Package syspkg finds the system programs the tests and the demo start
// (PostgreSQL, OpenSSH's sshd) and installs their Debian packages with
// apt-get when they are missing and we run as root. Otherwise it fails
// with the exact command to run: nothing is silently skipped.
package syspkg

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
)

var mu sync.Mutex

// Find returns the first existing path among the glob patterns; when none
// exists it installs pkgs (as root) and looks again.
func Find(patterns []string, pkgs ...string) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if p := find(patterns); p != "" {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%s not found; install it with: sudo apt-get install -y %s", patterns[0], join(pkgs))
	}
	if err := install(pkgs); err != nil {
		return "", err
	}
	if p := find(patterns); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("%s still not found after installing %s", patterns[0], join(pkgs))
}

func find(patterns []string) string {
	for _, pat := range patterns {
		m, _ := filepath.Glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // highest version first
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
	}
	return ""
}

func install(pkgs []string) error {
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	run := func(args ...string) error {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", args[0], err, tail(out))
		}
		return nil
	}
	if err := run(append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...); err == nil {
		return nil
	}
	if err := run("update"); err != nil {
		return err
	}
	return run(append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
