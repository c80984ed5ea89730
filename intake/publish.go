package intake

import (
	"fmt"
	"os"
)

// OpsWorker is the worker identity an ops command (replay, release,
// discard) works under: <worker_id>/ops-<pid>. No daemon's worker id can
// contain '/', so no daemon resumes a row of it as its own leftover, and
// while the command runs it renews the lease of what it holds, so no
// reconciler takes it over as a dead replica's.
func OpsWorker(worker string) string { return fmt.Sprintf("%s/ops-%d", worker, os.Getpid()) }
