package layers

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/partner-intake/partner-intake/"

// The rules: a package matched by from (and by none of except) depends on
// no package matched by forbid, directly or through another package.
// "x/..." matches x and every package under it; "..." matches every
// package of the module. They hold for the packages as built, not for
// their tests: an external test package (reconcile_test, say) may run the
// pipeline beside what it tests.
var rules = []struct {
	why    string
	from   []string
	except []string
	forbid []string
}{
	{
		why: "the ledger, the target, rows, partner config, the SFTP transport, the spool, what intake writes on a site, the daemon's own jobs (its config, worker id hold, session policy, site index, target holds, poll record, affinity, metrics, spool backpressure), the pipeline's pieces (unwrapping, a chunk's rows, the failure kinds, the site reads, a replay's hold-back, what a poll keeps of ready/, a poll's slots) and the internal packages sit below the pipeline, the reconciler, the ops views, the console and the commands",
		from: []string{"intake/ledger", "intake/target", "intake/rows", "intake/sitefile", "intake/pgpkeys", "intake/daemoncfg", "intake/workerid", "intake/sessions",
			"intake/siteindex", "intake/targethold", "intake/pollrecord", "intake/affinity", "intake/metrics", "intake/backpressure",
			"intake/unwrap", "intake/chunkrows", "intake/failure", "intake/siteread", "intake/holdback", "intake/readylist", "intake/slots", "partners", "partners/sftpconn", "spool", "internal/..."},
		forbid: []string{"intake", "reconcile", "intake/ops", "console", "cmd/..."},
	},
	{
		why:    "a subpackage of the pipeline is below it: the pipeline imports its subpackages, never the other way",
		from:   []string{"intake/..."},
		except: []string{"intake"},
		forbid: []string{"intake"},
	},
	{
		why:    "the reason codes are the bottom layer: every package may name them, they name no package of the module",
		from:   []string{"internal/reason"},
		forbid: []string{"..."},
	},
	{
		why:    "partner config sits below the SFTP transport, which reads it",
		from:   []string{"partners"},
		forbid: []string{"partners/sftpconn"},
	},
	{
		why:    "the reconciler does not import the pipeline",
		from:   []string{"reconcile"},
		forbid: []string{"intake"},
	},
	{
		why:    "the ops views sit above the ledger, not above the pipeline or the reconciler",
		from:   []string{"intake/ops"},
		forbid: []string{"intake", "reconcile"},
	},
	{
		why:    "only the commands import the commands' packages",
		from:   []string{"..."},
		except: []string{"cmd/..."},
		forbid: []string{"cmd/..."},
	},
	{
		why:    "the test harness is linked into tests only",
		from:   []string{"..."},
		except: []string{"internal/testenv"},
		forbid: []string{"internal/testenv"},
	},
}

// match reports whether the module's package rel (a path inside the
// module, "" for its root) is matched by pattern.
func match(rel, pattern string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == base || strings.HasPrefix(rel, base+"/")
	}
	return rel == pattern
}

func matchAny(rel string, patterns []string) bool {
	for _, p := range patterns {
		if match(rel, p) {
			return true
		}
	}
	return false
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// list runs `go list -json` over the module with tags.
func list(t *testing.T, tags string) []pkg {
	t.Helper()
	args := []string{"list", "-json=ImportPath,Imports,Deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = "../.." // the module's root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list listed %d packages: not the module", len(pkgs))
	}
	return pkgs
}

// rel is path inside the module, or false for a package of another
// module.
func rel(path string) (string, bool) {
	if path == strings.TrimSuffix(module, "/") {
		return "", true
	}
	return strings.CutPrefix(path, module)
}

func TestNoImportPointsUp(t *testing.T) {
	// the build tags change what some packages import (the crash tests'
	// fault hook, the demo, the CPU profile)
	for _, tags := range []string{"", "faults,demo,cpuprofile"} {
		var broken []string
		for _, p := range list(t, tags) {
			from, ok := rel(p.ImportPath)
			if !ok {
				continue
			}
			direct := map[string]bool{}
			for _, d := range p.Imports {
				direct[d] = true
			}
			for _, r := range rules {
				if !matchAny(from, r.from) || matchAny(from, r.except) {
					continue
				}
				for _, d := range p.Deps {
					to, ok := rel(d)
					if !ok || !matchAny(to, r.forbid) {
						continue
					}
					how := "imports"
					if !direct[d] {
						how = "depends on (through another package)"
					}
					broken = append(broken, from+" "+how+" "+to+": "+r.why)
				}
			}
		}
		sort.Strings(broken)
		for _, b := range broken {
			t.Errorf("tags %q: %s", tags, b)
		}
	}
}
