package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are set by the package build:
//
//	go build -ldflags "-X main.version=1.4.0 -X main.commit=$(git rev-parse --short HEAD)" ./cmd/intake
//
// Without them the module's build info answers (a `go install …@v1.4.0`
// knows its version; a VCS checkout built with -buildvcs knows its commit).
var (
	version = ""
	commit  = ""
)

// buildVersion is what `intake version` reports.
type buildVersion struct {
	Version, Commit, Go, Platform string
	Modified                      bool
}

func currentVersion() buildVersion {
	v := buildVersion{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if v.Commit == "" {
					v.Commit = s.Value
				}
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "dev"
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	if len(v.Commit) > 12 {
		v.Commit = v.Commit[:12]
	}
	return v
}

// String is one line, for `intake version`, `--version` and the daemon's
// start log: what an operator pastes into a ticket.
func (v buildVersion) String() string {
	s := fmt.Sprintf("intake %s (commit %s", v.Version, v.Commit)
	if v.Modified {
		s += ", modified"
	}
	return s + fmt.Sprintf(", %s, %s)", v.Go, v.Platform)
}

// versionCommand is `intake version`.
func versionCommand() *cobra.Command {
	return runs(&cobra.Command{
		Use:     "version",
		Short:   "print version, commit and Go version (also --version)",
		Example: "intake version",
	}, cmdVersion)
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "intake version: takes no arguments (got %q)\n", args[0])
		return 2
	}
	fmt.Fprintln(stdout, currentVersion())
	return 0
}
