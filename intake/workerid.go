package intake

import (
	"context"

	"github.com/partner-intake/partner-intake/intake/workerid"
)

// The daemon's hold on its worker id is intake/workerid's Keeper
// (Daemon.workerID): one live process per worker id; what the daemon
// does when the id is taken again is replica.regained (replica.go).

// errWorkerIDNotHeld: the process lost its worker id (its lock's session
// ended) and has not taken it again.
var errWorkerIDNotHeld = workerid.ErrNotHeld

// HoldWorkerIDOnPool takes this process's worker id on a connection of
// the daemon's pool (`intake run --once`; Start and PollOnce take it on a
// connection of its own when it was not taken), or returns a
// *ledger.WorkerIDInUseError naming the process that holds it.
func (d *Daemon) HoldWorkerIDOnPool(ctx context.Context) error { return d.workerID.HoldOnPool(ctx) }
